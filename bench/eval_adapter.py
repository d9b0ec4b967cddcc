"""Evaluation sampling from a saved policy adapter on a bf16 base: LoRA factors in fp32 (PEFT's default,
autocast_adapter_dtype=True) against factors cast to bf16 (what models.load_policy_adapter does), side by side,
alternating.

    .venv/bin/python bench/eval_adapter.py              # SmolLM2, 100 prompts, 48 new tokens, 2 rounds

The adapter is a fresh demo-sized LoRA (rank 16, every projection) with lora_B drawn from N(0, 0.02), so that it
changes the model. Prints each variant's seconds, its ratio to fp32 factors, and how far each variant's recorded
log-probs are from the fp32-factor model's full forward on the same tokens (the fp32 factors' own figure is the
KV-cache and bf16 rounding every sampler has).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from peft import PeftModel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ppo_rlhf.logprobs import token_logprobs  # noqa: E402
from ppo_rlhf.models import (  # noqa: E402
    LoraSettings,
    add_policy_lora,
    load_causal_lm,
    load_policy_adapter,
    load_tokenizer,
    resolve_model_path,
)
from ppo_rlhf.rollout import generate_rollout  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    name = resolve_model_path("smollm2")
    tokenizer = load_tokenizer(name)
    torch.manual_seed(0)
    trained = add_policy_lora(load_causal_lm(name, torch.bfloat16), LoraSettings())
    for param_name, param in trained.named_parameters():
        if "lora_B" in param_name:
            param.data.normal_(0, 0.02)
    adapter = Path(tempfile.mkdtemp()) / "adapter"
    trained.save_pretrained(adapter)
    del trained

    fp32_factors = PeftModel.from_pretrained(load_causal_lm(name, torch.bfloat16), adapter).eval()
    bf16_factors = load_policy_adapter(name, adapter, torch.bfloat16)
    variants = {"fp32 factors": fp32_factors, "bf16 factors": bf16_factors}
    prompts = [f"Write one sentence about topic number {i}." for i in range(args.prompts)]
    seconds: dict[str, list[float]] = {label: [] for label in variants}
    for _ in range(args.rounds):
        for label, model in variants.items():
            torch.manual_seed(1)
            start = time.perf_counter()
            with torch.no_grad():
                rollout = generate_rollout(model, tokenizer, prompts, args.new_tokens, 1.0,
                                           batch_size=args.prompts, record_logprobs=True)
                seconds[label].append(time.perf_counter() - start)
                reference = token_logprobs(fp32_factors, rollout.input_ids, rollout.attention_mask, 1.0)
            gap = (rollout.logprobs - reference)[rollout.action_mask.bool()].abs().mean()
            print(f"{label}: {seconds[label][-1]:.1f} s, {int(rollout.action_mask.sum())} tokens, "
                  f"recorded log-probs vs fp32-factor forward: mean abs {float(gap):.4f}", flush=True)
    base = min(seconds["fp32 factors"])
    for label, times in seconds.items():
        print(f"{label}: best {min(times):.1f} s, {min(times) / base:.2f}x fp32 factors")


if __name__ == "__main__":
    main()
