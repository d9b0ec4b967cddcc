"""Sampling inside HF `generate`: its own (warpers + torch.multinomial) against ours (`rollout.TokenSampler`:
inverse-CDF draw in a logits processor, generate run greedy), side by side, alternating.

    .venv/bin/python bench/sampler.py                  # SmolLM2 in bf16, batches 16 and 64, 64 new tokens
    .venv/bin/python bench/sampler.py --batches 64 --rounds 3

Every variant samples exactly `--new-tokens` tokens per row (EOS may not end a row early) from softmax(logits / T)
with no truncation, from the same seed, so they do the same steps (the draws differ: they use the RNG differently).
"ours+record" also keeps each token's log-prob and the entropy, as the evaluation and `old_logprobs: generation` do.
Prints row-tokens/s of each and ours/HF in time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import GenerationConfig, LogitsProcessorList

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.kv_cache import timed_generate  # noqa: E402
from ppo_rlhf.models import load_causal_lm, load_tokenizer  # noqa: E402
from ppo_rlhf.rollout import TokenSampler  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper and a storm."
VARIANTS = ("hf", "ours", "ours+record")


def generate_seconds(model, input_ids, attention_mask, new_tokens: int, variant: str, temperature: float,
                     pad: int) -> float:
    fixed = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, use_cache=True, pad_token_id=pad)
    if variant == "hf":
        config = GenerationConfig(do_sample=True, top_k=0, temperature=temperature, **fixed)
        processors = LogitsProcessorList()
    else:
        config = GenerationConfig(do_sample=False, **fixed)
        processors = LogitsProcessorList([TokenSampler(temperature, record=variant == "ours+record")])
    return timed_generate(model, input_ids, attention_mask, config, processors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of all variants, the order reversed each round")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model, getattr(torch, args.dtype))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.model} in {args.dtype}, "
          f"{args.new_tokens} new tokens per row, prompt {ids.shape[1]} tokens, {args.rounds} rounds")
    print(f"{'batch':>5} " + " ".join(f"{v + ' row-tok/s':>22}" for v in VARIANTS)
          + f" {'ours/HF time':>13} {'ours+record/HF':>15}")
    for batch in (int(b) for b in args.batches.split(",")):
        input_ids = ids.repeat(batch, 1)
        mask = torch.ones_like(input_ids)
        for variant in VARIANTS:  # warm-up of every path
            generate_seconds(model, input_ids, mask, 4, variant, args.temperature, tokenizer.pad_token_id)
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for r in range(args.rounds):
            for variant in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                times[variant].append(generate_seconds(model, input_ids, mask, args.new_tokens, variant,
                                                       args.temperature, tokenizer.pad_token_id))
        mean = {v: sum(t) / len(t) for v, t in times.items()}
        tokens = batch * args.new_tokens
        print(f"{batch:5d} " + " ".join(f"{tokens / mean[v]:22.1f}" for v in VARIANTS)
              + f" {mean['ours'] / mean['hf']:13.2f} {mean['ours+record'] / mean['hf']:15.2f}", flush=True)


if __name__ == "__main__":
    main()
