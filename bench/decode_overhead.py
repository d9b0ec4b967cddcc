"""Where a decoding step's time goes in our trainer's generation on a preset's task, against this CPU's bounds.

    .venv/bin/python bench/decode_overhead.py                     # configs/smollm2_add_tiny.yaml, 2 rounds
    .venv/bin/python bench/decode_overhead.py --rounds 1 --batches 1 --variants passive-2   # a quick look

The trainer is built from the preset as `bench/limit.py --config` builds it (PPOLoop: LoRA policy, the preset's
dtype, sampler, reply cap and batch; the task's training problems). One measurement is `trainer.rollout` of one
batch (the trainer's own generation: our decode loop that drops finished rows, log-probs recorded), timed, with
the number of decoding steps (its longest reply) and its reply tokens; the same prompts and seed for every variant,
so the "same replies" column says whether a variant samples what the first one does.

Variants (each a subprocess: OpenMP reads its environment once, when torch starts):
    passive-2   OMP_WAIT_POLICY=PASSIVE, torch's default threads (2 here): what bench/peer_grpo.py and the other
                benches set (idle OpenMP threads sleep at once; it helped on a shared machine, bench/HISTORY.md)
    default-2   OMP_WAIT_POLICY unset: libgomp's default (a waiting thread spins a while before it sleeps); what a
                user's `ppo-rlhf train` runs with
    passive-1, default-1   the same with one thread (torch.set_num_threads(1))
    passive-2-fp32   passive-2 with the weights in float32 (the preset's `dtype: auto` is bf16 on a CPU with bf16
                instructions): whether small-batch decoding runs faster in fp32 kernels here
In each process the batch is also generated with the LoRA adapter switched off (`disable_adapter`: the base model
alone), and from the merged copy `generation_merged_copy` samples from (ppo_rlhf/models/generation.py: the adapter
merged into a plain model's weights, refreshed before each batch as before each rollout, the refresh timed apart).
A fresh adapter is zero (LoRA's B starts at 0), so `--adapter` loads a trained one (a checkpoint's `policy` folder)
to make the merged copy's rounding real; the merged copy's distance from the policy is then measured on the
adapter path's own replies: per reply token, the full-vocabulary KL(policy || merged copy) at the sampling
temperature, beside the policy's own generation-against-training-forward distance (what `mismatch_kl` reads).

Per variant: ms per decoding step (median over batches and rounds), reply tokens/s, and a torch.profiler count of
the operators one generation runs per decoding step and their mean self time; beside them the step's bounds on
this CPU: reading every weight once (weight bytes / read bandwidth) and computing it (2 x parameters x rows / the
GEMM peak of the dtype), from bench/limit.py's measurements. Run it on a quiet machine.

Last run (2026-12-07 04:53-04:58 UTC, 2-core AMX + AVX512-BF16 Xeon, quiet; `--rounds 1 --batches 2 --variants
passive-2,default-2,passive-1,passive-2-fp32`): ms per step with the adapter 135.9 / 74.6 / 93.1 / 116.3 (adapter
off 84.5 / 50.0 / 68.6 / 96.6), ~14,400 aten calls a step; bounds 7.9 ms (weights read) and 1.7 ms (compute)
(docs/benchmarks.md). With `--adapter` (run 2's final ours-PPO adapter; 12:34-12:37 UTC, `--rounds 1 --batches 4
--variants default-2,passive-2`): adapter 87.6 / 166.2 ms a step, merged copy 57.3 / 92.1 (1.53x / 1.80x), 61/64
replies the same, KL(policy || merged copy) 6.1e-4 a reply token on average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRESET = ROOT / "configs" / "smollm2_add_tiny.yaml"
# name: (OMP_WAIT_POLICY or None for unset, threads or 0 for torch's default, dtype or None for the preset's)
VARIANTS = {"passive-2": ("PASSIVE", 0, None), "default-2": (None, 0, None), "passive-1": ("PASSIVE", 1, None),
            "default-1": (None, 1, None), "passive-2-fp32": ("PASSIVE", 0, "float32")}


def measure(args) -> dict:
    """One variant's process: its measurements as a dict."""
    wait_policy = os.environ.get("OMP_WAIT_POLICY")  # as OpenMP reads it when torch starts (limit sets a default)
    import torch

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    from limit import TASK_OF_PRESET, gemm_throughput, read_bandwidth

    from ppo_rlhf.config import build_config, read_yaml
    from ppo_rlhf.models.generation import make_generator
    from ppo_rlhf.models.logprobs import body_and_lm_head
    from ppo_rlhf.ppo.train_config import TrainConfig
    from ppo_rlhf.ppo.trainer import PPOLoop
    from ppo_rlhf.tasks.arithmetic import write_task

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="decode_"))
    settings = {**read_yaml(args.config), **({"policy_model": args.model} if args.model else {}),
                **({"dtype": args.dtype} if args.dtype else {})}
    settings.update(prompts=str(write_task(TASK_OF_PRESET[Path(args.config).name], work / "data")[0]),
                    out=str(work / "run"), tensorboard=False, quiet=True, device="cpu", log_completions_every=0,
                    seed=args.seed)
    trainer = PPOLoop(build_config(TrainConfig, settings))
    cfg = trainer.cfg
    if args.adapter:
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        loaded = set_peft_model_state_dict(trainer.policy, load_file(str(Path(args.adapter) /
                                                                          "adapter_model.safetensors")))
        if loaded.unexpected_keys:
            raise SystemExit(f"--adapter {args.adapter}: not this preset's adapter ({len(loaded.unexpected_keys)} "
                             "unexpected weights)")
    merged = make_generator(replace(cfg, generation_merged_copy=True), trainer.policy, trainer.tokenizer)
    body, head = body_and_lm_head(trainer.policy)
    weights = [p for name, p in body.named_parameters() if "embed_tokens" not in name and "lora_" not in name]
    n_params = sum(p.numel() for p in weights) + head.weight.numel()
    weight_bytes = sum(p.numel() * p.element_size() for p in weights) + head.weight.numel() * head.weight.element_size()
    dtype = head.weight.dtype
    peak = max(gemm_throughput(dtype).values())
    bandwidth = read_bandwidth()

    modes = ("adapter", "no adapter", "merged")
    merge_seconds: list[float] = []

    def generate(batch: int, mode: str):
        prompts = trainer.batch_prompts(list(range(batch * cfg.batch_size, (batch + 1) * cfg.batch_size)))
        if mode == "merged":  # the refresh the trainer runs before each rollout, outside the decoding time
            start = time.perf_counter()
            merged.sync(trainer.policy)
            merge_seconds.append(time.perf_counter() - start)
        torch.manual_seed(args.seed + batch)
        start = time.perf_counter()
        if mode == "adapter":
            rollout = trainer.rollout(prompts)
        elif mode == "merged":
            rollout = merged.generate([row.prompt for row in prompts])  # the generator takes bare prompts
        else:
            with trainer.policy.disable_adapter():
                rollout = trainer.rollout(prompts)
        return time.perf_counter() - start, rollout

    @torch.no_grad()
    def distances(rollout) -> tuple[list[float], list[float]]:
        """Per reply token of the policy's own sample: KL(policy || merged copy) over the vocabulary, and
        |log-prob recorded while sampling - the training forward's| (the policy against itself)."""
        def logprobs(model):
            logits = model(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask).logits[:, :-1]
            return torch.log_softmax(logits.float() / cfg.temperature, dim=-1)

        mask = rollout.action_mask.bool()  # [B, L-1], aligned with the logits that predict each token
        policy_lp, merged_lp = logprobs(trainer.policy), logprobs(merged.policy)
        kl = (policy_lp.exp() * (policy_lp - merged_lp)).sum(-1)[mask]
        forward = policy_lp.gather(-1, rollout.input_ids[:, 1:, None]).squeeze(-1)
        return kl.tolist(), (rollout.logprobs - forward)[mask].abs().tolist()

    generate(args.batches, "adapter")  # warm-up: first calls pay one-off costs (a batch not measured)
    generate(args.batches, "merged")
    rows: dict[str, list] = {mode: [] for mode in modes}
    replies: dict[str, list] = {mode: [] for mode in modes}
    kl_merged: list[float] = []
    own_gap: list[float] = []
    for batch in range(args.batches):
        for mode in modes if batch % 2 == 0 else modes[::-1]:
            seconds, rollout = generate(batch, mode)
            rows[mode].append({"seconds": seconds, "steps": int(rollout.reply_lengths.max()),
                               "tokens": int(rollout.reply_lengths.sum())})
            replies[mode].extend(rollout.reply_ids)
            if mode == "adapter":
                kl, gap = distances(rollout)
                kl_merged.extend(kl)
                own_gap.extend(gap)
    from torch.profiler import ProfilerActivity, profile

    def operators(mode: str) -> tuple[float, float]:
        """aten operator calls per decoding step of one generation, and their mean self time (us)."""
        torch.manual_seed(args.seed)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            _, rollout = generate(0, mode)
        events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
        count = sum(e.count for e in events)
        return count / int(rollout.reply_lengths.max()), sum(e.self_cpu_time_total for e in events) / max(count, 1)

    ops_per_step, op_self_us = operators("adapter")
    ops_per_step_merged, _ = operators("merged")

    def mean_max(values: list[float]) -> list[float]:
        return [statistics.fmean(values), max(values)] if values else [0.0, 0.0]

    return {"threads": torch.get_num_threads(), "omp_wait_policy": wait_policy,
            "dtype": str(dtype), "batch_size": cfg.batch_size, "max_new_tokens": cfg.max_new_tokens,
            "n_params": n_params, "weight_bytes": weight_bytes, "gemm_peak_gflops": peak, "bandwidth_gbs": bandwidth,
            "adapter": args.adapter, "rows": rows, "replies": replies["adapter"],
            "merged_same_replies": [sum(a == b for a, b in zip(replies["merged"], replies["adapter"])),
                                    len(replies["adapter"])],
            "merge_seconds": statistics.median(merge_seconds), "kl_policy_merged": mean_max(kl_merged),
            "policy_generation_gap": mean_max(own_gap), "ops_per_step": ops_per_step,
            "ops_per_step_merged": ops_per_step_merged, "op_self_us_mean": op_self_us}

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(PRESET), help="a preset of a verifiable task (bench/limit.py's)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated from {', '.join(VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; the variants' order reverses each round")
    parser.add_argument("--batches", type=int, default=3, help="batches a variant generates per round")
    parser.add_argument("--model", help="a model folder instead of the preset's (a tiny one for a dry run)")
    parser.add_argument("--adapter", help="a trained LoRA adapter of the preset's policy (a checkpoint's policy "
                        "folder) to measure with: a fresh one is zero, so merging it would change nothing")
    parser.add_argument("--json", help="write the table's numbers here")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)  # one variant's process
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(measure(args)), flush=True)
        return
    names = args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    results: dict[str, list[dict]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            policy, threads, dtype = VARIANTS[name]
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            env.update({"HF_HUB_OFFLINE": "1", **({"OMP_WAIT_POLICY": policy} if policy else {})})
            command = [sys.executable, __file__, "--child", "--config", args.config, "--batches", str(args.batches),
                       "--seed", str(args.seed), "--threads", str(threads),
                       *(["--model", args.model] if args.model else []), *(["--dtype", dtype] if dtype else []),
                       *(["--adapter", args.adapter] if args.adapter else [])]
            proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT)
            line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            result = json.loads(line[len("RESULT "):])
            results[name].append(result)
            per_step = [r["seconds"] / r["steps"] * 1e3 for r in result["rows"]["adapter"]]
            print(f"round {round_} {name}: {statistics.median(per_step):.1f} ms/step with the adapter", flush=True)
    first = results[names[0]][0]  # the bounds are the first variant's (its dtype's bytes and GEMM peak)
    bytes_, n, peak, bandwidth = (first[k] for k in ("weight_bytes", "n_params", "gemm_peak_gflops",
                                                     "bandwidth_gbs"))
    rows = first["batch_size"]
    read_ms, compute_ms = bytes_ / (bandwidth * 1e9) * 1e3, 2 * n * rows / (peak * 1e9) * 1e3
    print(f"\n{Path(args.config).name}: {first['dtype']}, batch {rows}, reply cap {first['max_new_tokens']}; a "
          f"decoding step's bounds here: reading the {bytes_ / 1e6:.0f} MB of weights once {read_ms:.1f} ms "
          f"({bandwidth:.1f} GB/s), computing {2 * n * rows / 1e9:.1f} GFLOP {compute_ms:.1f} ms (GEMM peak "
          f"{peak:.0f} GFLOP/s)")
    print("\n| variant | ms/step (adapter) | ms/step (no adapter) | reply tokens/s | ops/step | mean op self time "
          "| same replies as the first |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    reference = [ids for r in results[names[0]] for ids in r["replies"]]
    summary = {}
    for name, runs in results.items():
        with_adapter = [r for run in runs for r in run["rows"]["adapter"]]
        without = [r for run in runs for r in run["rows"]["no adapter"]]
        per_step = statistics.median(r["seconds"] / r["steps"] * 1e3 for r in with_adapter)
        per_step_base = statistics.median(r["seconds"] / r["steps"] * 1e3 for r in without)
        tokens_s = sum(r["tokens"] for r in with_adapter) / sum(r["seconds"] for r in with_adapter)
        ops = statistics.median(run["ops_per_step"] for run in runs)
        op_us = statistics.median(run["op_self_us_mean"] for run in runs)
        replies = [ids for run in runs for ids in run["replies"]]
        same = sum(a == b for a, b in zip(replies, reference))
        print(f"| {name} | {per_step:.1f} | {per_step_base:.1f} | {tokens_s:.1f} | {ops:.0f} | {op_us:.1f} us "
              f"| {same}/{len(reference)} |")
        summary[name] = {"ms_per_step": per_step, "ms_per_step_no_adapter": per_step_base,
                         "reply_tokens_per_s": tokens_s, "ops_per_step": ops, "op_self_us_mean": op_us,
                         "same_replies": [same, len(reference)]}
    print(f"\nThe merged copy (generation_merged_copy) against the adapter path it replaces"
          f"{', adapter ' + first['adapter'] if first['adapter'] else ' (a fresh adapter: zero)'}:")
    print("\n| variant | ms/step (merged) | adapter / merged time | refresh s | ops/step (merged) | same replies "
          "| KL(policy \\|\\| merged) per token, mean / max | policy's own generation gap, mean / max |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, runs in results.items():
        merged = [r for run in runs for r in run["rows"]["merged"]]
        per_step_merged = statistics.median(r["seconds"] / r["steps"] * 1e3 for r in merged)
        ratio = summary[name]["ms_per_step"] / per_step_merged
        same = [sum(run["merged_same_replies"][i] for run in runs) for i in (0, 1)]
        kl, gap = runs[0]["kl_policy_merged"], runs[0]["policy_generation_gap"]  # the same in every round
        refresh = statistics.median(run["merge_seconds"] for run in runs)
        ops = statistics.median(run["ops_per_step_merged"] for run in runs)
        print(f"| {name} | {per_step_merged:.1f} | {ratio:.2f} | {refresh:.2f} | {ops:.0f} | {same[0]}/{same[1]} "
              f"| {kl[0]:.1e} / {kl[1]:.2f} | {gap[0]:.1e} / {gap[1]:.2f} |")
        summary[name].update(ms_per_step_merged=per_step_merged, adapter_over_merged=ratio,
                             merged_same_replies=same, kl_policy_merged=kl, policy_generation_gap=gap)
    print(f"\nbounds: weights-read {read_ms:.1f} ms/step, compute {compute_ms:.1f} ms/step")
    if args.json:
        Path(args.json).write_text(json.dumps({"bounds_ms": {"weights_read": read_ms, "compute": compute_ms},
                                               "variants": summary, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
