"""KL per token between the vLLM engine and the HF LoRA policy after a sync, at an engine dtype (bf16 by default):
the measurement tests/test_vllm_engine.py asserts at float32, for the dtype the tests do not start an engine for.

    .venv/bin/python bench/vllm_kl.py [--dtype bfloat16]

Same tiny model, adapter and prompts as the test (its helpers); prints KL(vLLM || policy) per sampled token over
the whole vocabulary and the largest |log-prob difference| of the sampled tokens, against the policy in float32
and in the engine's dtype.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    import test_vllm_engine as helpers

    from ppo_rlhf.chat import chat_prompt_ids
    from ppo_rlhf.generation import VLLMGenerator, VLLMServer, vllm_python

    import tiny

    if vllm_python() is None:
        print("no vLLM engine: run `make venv-vllm`", file=sys.stderr)
        return 2
    tokenizer = tiny.tiny_tokenizer()
    folder = tiny.eos_prone_policy(tokenizer, Path(tempfile.mkdtemp()) / "policy", extra=0.3, head_dim=32)
    server = VLLMServer(str(folder), vllm_python(), dtype=args.dtype, max_logprobs=len(tokenizer))
    policy = helpers.lora_policy(folder)
    VLLMGenerator(server, tokenizer, [tokenizer.eos_token_id], 8, helpers.TEMPERATURE).sync(policy)
    prompt_ids = [chat_prompt_ids(tokenizer, p) for p in helpers.PROMPTS]
    for policy_dtype in dict.fromkeys([torch.float32, getattr(torch, args.dtype)]):
        kl, diff = helpers.engine_vs_policy(server, policy.to(policy_dtype), tokenizer, prompt_ids)
        print(f"{args.dtype} engine vs {policy_dtype} policy: KL per token mean {kl.mean():.2e} max {kl.max():.2e}; "
              f"max |log-prob diff| of the sampled tokens {diff.max():.2e}")
    server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
