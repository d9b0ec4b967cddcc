"""HF `generate` with its default (dynamic) KV cache against a static one, side by side, alternating.

    .venv/bin/python bench/kv_cache.py                       # SmolLM2 in bf16, batches 8 and 32, 48 new tokens
    .venv/bin/python bench/kv_cache.py --dtype float32 --batches 8

A static cache (`cache_implementation="static"`) preallocates the keys and values for the whole reply instead of
growing them by one position per step (a `torch.cat` per layer per step); on a GPU its point is to let
`torch.compile` capture a fixed-shape step. Both variants sample exactly `--new-tokens` tokens per row (EOS is not
allowed to end a row early), from the same seed, so they do the same steps; the script prints row-tokens/s of each
and static/dynamic. Issue 15 item 3 asks to take this win if it is one; bench/README.md has the numbers.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ppo_rlhf.models import load_causal_lm, load_tokenizer  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper and a storm."


def generate_seconds(model, input_ids, attention_mask, new_tokens: int, cache: str | None, pad: int) -> float:
    config = GenerationConfig(do_sample=True, max_new_tokens=new_tokens, min_new_tokens=new_tokens, top_k=0,
                              temperature=1.0, use_cache=True, pad_token_id=pad, cache_implementation=cache)
    return timed_generate(model, input_ids, attention_mask, config)


def timed_generate(model, input_ids, attention_mask, config: GenerationConfig, processors=None) -> float:
    """Seconds of one `generate` from seed 0 that must give every row exactly config.max_new_tokens tokens."""
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                             logits_processor=processors)
    seconds = time.perf_counter() - start
    assert out.shape[1] == input_ids.shape[1] + config.max_new_tokens
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="alternating pairs (dynamic, static, static, dynamic)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model, dtype)  # frozen weights stored in dtype, as the trainer's
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.model} in {args.dtype}, "
          f"{args.new_tokens} new tokens per row, prompt {ids.shape[1]} tokens")
    print(f"{'batch':>5} {'dynamic row-tok/s':>18} {'static row-tok/s':>17} {'static/dynamic time':>20}")
    for batch in (int(b) for b in args.batches.split(",")):
        input_ids = ids.repeat(batch, 1)
        mask = torch.ones_like(input_ids)
        generate_seconds(model, input_ids, mask, 4, None, tokenizer.pad_token_id)  # warm-up of both paths
        generate_seconds(model, input_ids, mask, 4, "static", tokenizer.pad_token_id)
        times = {"dynamic": [], "static": []}
        for r in range(args.rounds):
            for cache in (("dynamic", "static") if r % 2 == 0 else ("static", "dynamic")):
                seconds = generate_seconds(model, input_ids, mask, args.new_tokens,
                                           None if cache == "dynamic" else "static", tokenizer.pad_token_id)
                times[cache].append(seconds)
        dynamic, static = (sum(times[c]) / len(times[c]) for c in ("dynamic", "static"))
        tokens = batch * args.new_tokens
        print(f"{batch:5d} {tokens / dynamic:18.1f} {tokens / static:17.1f} {static / dynamic:20.2f}", flush=True)


if __name__ == "__main__":
    main()
