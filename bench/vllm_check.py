"""GPU check of the vLLM generation backend, on a machine with CUDA and a GPU build of vLLM in its own environment
(PPO_RLHF_VLLM_PYTHON=that environment's python; the engine runs in its own process, ppo_rlhf/models/vllm_server.py).
Not run yet (no GPU lent so far); the CPU build is checked by tests/models/test_vllm_engine.py and bench/vllm_cpu.py:

    python bench/vllm_check.py [--model smollm2] [--prompts 16] [--max-new-tokens 32]

1. builds the LoRA policy and a VLLMGenerator on the same base model;
2. perturbs the adapter, syncs the merged weights, and checks that vLLM's greedy continuation equals HF's greedy
   continuation of the merged policy (the sync reached the engine);
3. samples a rollout at the training temperature, re-scores it with the trainer's token_logprobs, and prints how far
   vLLM's own log-probs of the same tokens are from ours (a diagnostic: the trainer never uses vLLM's);
4. prints tokens/s of both backends.
Exit status 0 when the checks pass.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.7)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check", file=sys.stderr)
        return 2

    from ppo_rlhf.models.generation import VLLMGenerator
    from ppo_rlhf.models.loading import LoraSettings, load_policy, load_tokenizer, resolve_model_path
    from ppo_rlhf.models.logprobs import token_logprobs
    from ppo_rlhf.models.merge import merged_state_dict
    from ppo_rlhf.models.rollout import eos_token_ids, generate_rollout

    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(path)
    policy = load_policy(path, LoraSettings(rank=8, alpha=16)).cuda()
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    eos = eos_token_ids(policy, tokenizer)
    prompts = [f"Write one sentence about the number {i}." for i in range(args.prompts)]

    gen = VLLMGenerator.create(path, tokenizer, eos, args.max_new_tokens, args.temperature)
    gen.sync(policy)

    # 2. greedy agreement after the sync (a near-zero temperature in vLLM vs argmax in HF)
    greedy = VLLMGenerator(gen.engine, tokenizer, eos, 8, 1e-4)
    vllm_greedy = greedy.generate(prompts[:4])
    merged = load_policy(path, LoraSettings(rank=8, alpha=16)).cuda().base_model.model
    merged.load_state_dict({k: v for k, v in merged_state_dict(policy).items()}, strict=False)
    agree = 0
    for i, prompt in enumerate(prompts[:4]):
        ids = torch.tensor([vllm_greedy.prompt_ids[i]], device="cuda")
        out = merged.generate(input_ids=ids, max_new_tokens=8, do_sample=False, eos_token_id=eos)
        hf = out[0, ids.shape[1]:].tolist()
        agree += hf[: len(vllm_greedy.reply_ids[i])] == vllm_greedy.reply_ids[i]
    print(f"greedy agreement after sync: {agree}/4")

    # 3. our log-probs of vLLM's tokens
    start = time.perf_counter()
    rollout = gen.generate(prompts)
    vllm_time = time.perf_counter() - start
    with torch.no_grad():
        ours = token_logprobs(policy, rollout.input_ids.cuda(), rollout.attention_mask.cuda(), args.temperature).cpu()
    act = rollout.action_mask.bool()
    print(f"vLLM rollout: {int(rollout.reply_lengths.sum())} tokens in {vllm_time:.2f}s; "
          f"mean log pi_old (ours, T={args.temperature}) {float(ours[act].mean()):+.3f}; finished "
          f"{float(rollout.finished.float().mean()):.2f}")
    start = time.perf_counter()
    hf_rollout = generate_rollout(policy, tokenizer, prompts, args.max_new_tokens, args.temperature)
    hf_time = time.perf_counter() - start
    print(f"HF rollout: {int(hf_rollout.reply_lengths.sum())} tokens in {hf_time:.2f}s")
    ok = agree >= 3 and bool(torch.isfinite(ours[act]).all())
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
