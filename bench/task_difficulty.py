"""The start policy's exact-match accuracy on held-out problems of each task level (ppo_rlhf/tasks/arithmetic.py), to
choose a level where SmolLM2-135M-Instruct starts between about 10% and 50% (results in bench/HISTORY.md).

    OMP_NUM_THREADS=1 .venv/bin/python bench/task_difficulty.py --levels add-small,add,mul-small --n 150

One reply per problem, sampled at the trainer's temperature (0.7, top_p 1) from a fixed seed, in the trainer's
`dtype` "auto" (bfloat16 on a CPU with AVX512-BF16/AMX). Accuracy comes with a 95% Wilson interval over problems.

Measured 2026-12-04 16:08-16:24 UTC, this 2-core machine (CPU flags amx_bf16 avx2 avx512_bf16; shared, load 2.5-7),
OMP_NUM_THREADS=1, bfloat16, temperature 0.7, reply cap 64 tokens, one reply per held-out problem:

    --levels add-tiny,add-small,add --n 200 --seed 0
    add-tiny   18.5% (95% 13.7%-24.5%), format 4.5%, finished 96.0%, 19.2 reply tokens, 103 s
    add-small   8.5% (95%  5.4%-13.2%), format 6.5%, finished 89.0%, 22.9 reply tokens, 133 s
    add         6.0% (95%  3.5%-10.2%), format 5.5%, finished 96.0%, 19.7 reply tokens, 124 s
    --levels add-tiny --n 289 --seed 1              (every held-out add-tiny problem)
    add-tiny   14.9% (95% 11.2%-19.4%), format 3.1%, finished 91.7%, 21.3 reply tokens, 246 s
    --levels add-small,sub-small,mul-small,add --n 48 --seed 0     (a first look)
    add-small 10.4%, sub-small 4.2%, mul-small 6.2%, add 10.4% (each 95% interval about +-8 points)

add-tiny is the level inside 10-50%. Other wordings of the add-small prompt (no format line; "Calculate ..."; a
worked example in the prompt) gave 8-15% on 48 problems: the model's arithmetic, not the instruction, sets the rate.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion."""
    centre = (hits + z * z / 2) / (n + z * z)
    half = z * math.sqrt(hits * (n - hits) / n + z * z / 4) / (n + z * z)
    return centre - half, centre + half


def measure(model, tokenizer, level: str, n: int, args) -> dict:
    import torch

    from ppo_rlhf.models.rollout import generate_rollout
    from ppo_rlhf.tasks.arithmetic import answer_format, exact_match, problems

    rows = problems(level, "heldout", n, seed=args.seed)
    prompts, answers = [r["prompt"] for r in rows], [r["answer"] for r in rows]
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    rollout = generate_rollout(model, tokenizer, prompts, args.max_new_tokens, args.temperature, args.batch)
    seconds = time.perf_counter() - started
    texts = rollout.reply_texts
    correct = exact_match(prompts, texts, rollout.reply_ids, answers)
    formatted = answer_format(prompts, texts, rollout.reply_ids)
    hits = int(sum(correct))
    lo, hi = wilson(hits, n)
    return {"level": level, "n": n, "exact_match": hits / n, "ci95": [round(lo, 3), round(hi, 3)],
            "format": sum(formatted) / n, "finished": float(rollout.finished.float().mean()),
            "reply_tokens": float(rollout.reply_lengths.float().mean()), "seconds": round(seconds, 1),
            "examples": [{"prompt": p, "answer": a, "reply": t} for p, a, t in list(zip(prompts, answers, texts))[:3]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="add-small,add,mul-small")
    parser.add_argument("--n", type=int, default=150, help="held-out problems per level")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    from ppo_rlhf.tasks.arithmetic import LEVELS

    unknown = [name for name in args.levels.split(",") if name not in LEVELS]
    if unknown:
        parser.error(f"unknown level(s) {', '.join(unknown)}; choose from {', '.join(LEVELS)}")

    import torch

    from ppo_rlhf.models.loading import load_causal_lm, load_tokenizer, resolve_model_path
    from ppo_rlhf.models.precision import cpu_matrix_flags, resolve_dtype

    path = resolve_model_path("smollm2")
    dtype = resolve_dtype(args.dtype, torch.device("cpu"))
    tokenizer, model = load_tokenizer(path), load_causal_lm(path, dtype)
    header = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "command": " ".join(sys.argv),
              "cpu_flags": cpu_matrix_flags(), "torch_threads": torch.get_num_threads(), "dtype": str(dtype),
              "temperature": args.temperature, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
              "machine": platform.processor() or platform.machine()}
    print(json.dumps(header), flush=True)
    results = []
    for level in args.levels.split(","):
        result = measure(model, tokenizer, level, args.n, args)
        results.append(result)
        print(f"{level:10s} exact-match {result['exact_match']:.1%} (95% {result['ci95'][0]:.1%}-"
              f"{result['ci95'][1]:.1%}), format {result['format']:.1%}, finished {result['finished']:.1%}, "
              f"{result['reply_tokens']:.1f} reply tokens, {result['seconds']:.0f} s", flush=True)
        for example in result["examples"]:
            print(f"    {example['prompt']!r} -> {example['reply'][:120]!r} (answer {example['answer']})")
    if args.json:
        Path(args.json).write_text(json.dumps({**header, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
