"""Generation tokens/s on this CPU: the vLLM engine (.venv-vllm, its own process) against Hugging Face `generate`.

    .venv/bin/python bench/vllm_cpu.py [--models smollm2,qwen-shape] [--batches 8,32] [--dtypes float32,bfloat16]
                                       [--max-new-tokens 48] [--repeats 1]

Both sides sample the same chat prompts with the trainer's settings (temperature 0.7, no top-k/top-p truncation,
stop at EOS, the reply cap) through the trainer's own code paths: `rollout.generate_rollout` on the model for HF,
`VLLMGenerator.generate` for vLLM. tokens/s = reply tokens produced / wall seconds of the call. Each (model, dtype)
starts one engine (its start time is printed); each (side, batch) has one untimed warm-up call first (vLLM's first
call of a shape is slow). Replies end at different lengths on the two sides, so tokens/s, not seconds, is compared.

Last run (bench/HISTORY.md, "Results, vLLM on this CPU"), 2026-12-03 14:09-14:24 UTC, quiet machine:

    .venv/bin/python bench/vllm_cpu.py --models smollm2,qwen-shape --batches 8,32 --dtypes float32,bfloat16

    vLLM/HF tokens/s: SmolLM2 fp32 1.58 (batch 8), 1.19 (32), bf16 1.43, 1.14; Qwen2.5-0.5B shape fp32 1.69, 1.15,
    bf16 0.94, 1.18; engine start 37 s (SmolLM2), 39-58 s (Qwen shape)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

TEMPERATURE = 0.7
TOPICS = ["the sea", "a cat", "energy", "a king", "the rain", "music", "a city", "bread"]


def prompts(batch: int) -> list[str]:
    return [f"Write a short story about {TOPICS[i % len(TOPICS)]} (number {i})." for i in range(batch)]


def timed(generate, batch_prompts: list[str], repeats: int) -> float:
    """Best tokens/s over `repeats` timed calls, after one warm-up call."""
    generate(batch_prompts)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        rollout = generate(batch_prompts)
        best = max(best, float(rollout.reply_lengths.sum()) / (time.perf_counter() - start))
    return best


def hf_side(folder: str, dtype: str, batches: list[int], cap: int, repeats: int) -> dict[int, float]:
    from transformers import AutoModelForCausalLM

    from ppo_rlhf.models.loading import load_tokenizer
    from ppo_rlhf.models.rollout import generate_rollout

    tokenizer = load_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    return {b: timed(lambda p: generate_rollout(model, tokenizer, p, cap, TEMPERATURE), prompts(b), repeats)
            for b in batches}


def vllm_side(folder: str, dtype: str, batches: list[int], cap: int, repeats: int) -> tuple[float, dict[int, float]]:
    from transformers import AutoConfig

    from ppo_rlhf.models.chat import chat_prompt_ids
    from ppo_rlhf.models.generation import VLLMGenerator, VLLMServer, vllm_python
    from ppo_rlhf.models.loading import load_tokenizer

    tokenizer = load_tokenizer(folder)
    config = AutoConfig.from_pretrained(folder)
    eos = sorted({tokenizer.eos_token_id} | set(torch.tensor(config.eos_token_id).flatten().tolist()))
    start = time.perf_counter()
    longest = max(len(chat_prompt_ids(tokenizer, p)) for p in prompts(max(batches))) + cap
    server = VLLMServer(folder, vllm_python(), dtype=dtype, max_model_len=longest, kv_cache_gib=2)
    started = time.perf_counter() - start
    gen = VLLMGenerator(server, tokenizer, eos, cap, TEMPERATURE)
    try:
        return started, {b: timed(gen.generate, prompts(b), repeats) for b in batches}
    finally:
        server.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm2", help="comma-separated: smollm2, qwen-shape")
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    from common import prepare_model  # the offline SmolLM2 folder, or the random Qwen2.5-0.5B-shaped one

    from ppo_rlhf.models.generation import vllm_python

    if vllm_python() is None:
        print("no vLLM engine: run `make venv-vllm`", file=sys.stderr)
        return 2
    batches = [int(b) for b in args.batches.split(",")]
    print(f"threads {torch.get_num_threads()}, reply cap {args.max_new_tokens}, temperature {TEMPERATURE}")
    print("model       dtype     side  batch  tokens/s")
    for name in args.models.split(","):
        folder = prepare_model(name)
        for dtype in args.dtypes.split(","):
            started, engine = vllm_side(folder, dtype, batches, args.max_new_tokens, args.repeats)
            hf = hf_side(folder, dtype, batches, args.max_new_tokens, args.repeats)
            for batch in batches:
                print(f"{name:<11} {dtype:<9} vLLM  {batch:>5}  {engine[batch]:8.1f}   (engine start {started:.0f} s)")
                ratio = engine[batch] / hf[batch]
                print(f"{name:<11} {dtype:<9} HF    {batch:>5}  {hf[batch]:8.1f}   (vLLM/HF {ratio:.2f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
