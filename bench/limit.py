"""How close one PPO iteration of our trainer comes to this machine's limit (bench/HISTORY.md).

    .venv/bin/python bench/limit.py --batch 8 --minibatch 4 --max-new-tokens 48
    .venv/bin/python bench/limit.py --config configs/smollm2_add_tiny.yaml --iterations 3   # a preset's own settings

1. The machine: fp32 and bf16 GEMM throughput (torch.matmul, best of several shapes) and memory read bandwidth.
2. One warm-up and `--iterations` timed iterations of our trainer on SmolLM2-135M (LoRA policy, LoRA value model).
3. Per phase: the FLOPs it had to do (bench/common.py's `iteration_flops`), from the token counts the trainer actually
   ran (each chunk trimmed to its own longest row, so padding is counted where it is computed), and the model-FLOPs
   utilisation = FLOPs / time / GEMM peak of the dtype the phase's matmuls ran in (`--dtype`: the trainer's setting;
   bf16 stores the frozen weights in bf16, so every large matmul of every phase is a bf16 one; the fp32 LoRA factors
   (rank 16) are ~5% of SmolLM2's FLOPs).
   N = the body's parameters (no embedding), H = hidden x vocab (the LM head).
     forward            2N per token (+ 2H for the policy's logits, only where the head runs: from the first reply
                        position)
     forward+backward   6N per token, the usual "model FLOPs" (the frozen weights' own gradient is never computed
                        with LoRA, so the work really done is 4N, + the LM head's 2H forward, 2H backward and 2H
                        recompute)
   Generation: tokens per second against the bound that reading every weight once per decoding step sets
   (batch x bandwidth / weight bytes), and the compute bound.

Last run (bench/HISTORY.md, ninth session), 2026-12-04 10:08-10:15 UTC, quiet machine:

    MALLOC_MMAP_THRESHOLD_=131072 GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python bench/limit.py \
        --model qwen-shape --batch 32 --minibatch 16 --max-new-tokens 48 --dtype bfloat16

    bf16 GEMM peak 385.5 GFLOP/s (fp32 168.8); one iteration 171.86 s: generation 19.65 s, MFU 36.7% (78 reply
    tokens/s); scoring 39.39 s, 59.3%; update 112.82 s, 62.1% (6N), 43.6% in work done (4N + head)
On add-tiny's preset (2026-12-07, 2-core AMX + AVX512-BF16 Xeon, quiet; docs/benchmarks.md):

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python bench/limit.py --config configs/smollm2_add_tiny.yaml \
        --iterations 2

    bf16 GEMM peak 2321.0 GFLOP/s (fp32 380.3); iterations 27.70 and 22.96 s: generation 8.13 / 5.38 s, MFU 2.5% /
    3.1%; scoring 4.02 / 3.26 s, 12.0% / 11.1%; update 15.54 / 14.32 s, 12.2% / 9.9% (6N)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP (see bench/HISTORY.md)

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


# a verifiable task's preset: the level whose training problems it reads
TASK_OF_PRESET = {"smollm2_add_tiny.yaml": "add-tiny"}
CPU_SHAPES = {"2048^3": (2048, 2048, 2048), "1024x576x1536": (1024, 576, 1536), "1024x1536x576": (1024, 1536, 576),
              "1024x576x49152": (1024, 576, 49152), "4096^3": (4096, 4096, 4096)}


def gemm_throughput(dtype: torch.dtype, seconds: float = 1.0, shapes: dict = CPU_SHAPES,
                    device: str = "cpu") -> dict[str, float]:
    """GFLOP/s of matmul in `dtype` for a few shapes (square and the transformer's own), best of 3 timed bursts
    (random data; on CUDA the burst ends with a synchronize, so queued products are counted only once done)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    out = {}
    for name, (m, k, n) in shapes.items():
        a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
        a @ b
        sync()
        best = 0.0
        for _ in range(3):
            start, count = time.perf_counter(), 0
            while time.perf_counter() - start < seconds / 3:
                a @ b
                count += 1
                if count % 16 == 0:
                    sync()  # keep the queue short, so the clock check above is close to the device
            sync()
            best = max(best, 2 * m * k * n * count / (time.perf_counter() - start) / 1e9)
        out[name] = best
    return out


def read_bandwidth() -> float:
    """GB/s of reading a 1 GB fp32 tensor (x.sum()), best of 5."""
    x = torch.ones(2**28)
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - start) / 1e9)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a training config (e.g. configs/smollm2_add_tiny.yaml): its model, task, "
                        "rewards and settings instead of the defaults below (a verifiable task's problems written "
                        "afresh); the options below given explicitly still apply")
    parser.add_argument("--model", default=None, help="smollm2 (default) or qwen-shape")
    parser.add_argument("--batch", type=int, default=None, help="default 8")
    parser.add_argument("--minibatch", type=int, default=None, help="default 4")
    parser.add_argument("--epochs", type=int, default=None, help="default 2")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 48")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--dtype", default="auto", help="the trainer's dtype setting (auto, float32, bfloat16)")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.config and not Path(args.config).is_file():
        parser.error(f"--config: no such file: {args.config}")

    from ppo_rlhf.models.precision import dtype_name, resolve_dtype

    dtype = resolve_dtype(args.dtype, torch.device("cpu"))
    gemms = {dtype_name(d): gemm_throughput(d) for d in (torch.float32, torch.bfloat16)}
    peaks = {name: max(gemm.values()) for name, gemm in gemms.items()}
    peak = peaks[dtype_name(dtype)]  # every MFU below is against the peak of the dtype it ran in
    bandwidth = read_bandwidth()
    print(f"== machine: {torch.get_num_threads()} threads; read bandwidth {bandwidth:.1f} GB/s")
    for name, gemm in gemms.items():
        print(f"  {name:8s} GEMM GFLOP/s " + ", ".join(f"{k} {v:.1f}" for k, v in gemm.items())
              + f"; peak {peaks[name]:.1f}")
    print(f"== the trainer runs in {dtype}: MFU against {peak:.1f} GFLOP/s")

    from common import PROMPTS, iteration_flops, model_sizes, prepare_model

    from ppo_rlhf.config import build_config, read_yaml
    from ppo_rlhf.ppo.train_config import TrainConfig
    from ppo_rlhf.ppo.trainer import PPOLoop
    from ppo_rlhf.tasks.arithmetic import write_task

    work = Path(tempfile.mkdtemp(prefix="limit_"))
    given = {key: value for key, value in (("policy_model", args.model), ("batch_size", args.batch),
                                           ("minibatch_size", args.minibatch), ("epochs", args.epochs),
                                           ("max_new_tokens", args.max_new_tokens)) if value is not None}
    if args.config:
        settings = {**read_yaml(args.config), **given}
        level = TASK_OF_PRESET.get(Path(args.config).name)
        if level:  # the preset's problems file, written here (its path is relative to wherever it was made)
            settings["prompts"] = str(write_task(level, work / "data")[0])
    else:
        path = prepare_model(given.get("policy_model", "smollm2"))
        (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
        settings = {"batch_size": 8, "minibatch_size": 4, "epochs": 2, "max_new_tokens": 48, **given,
                    "policy_model": path, "reward_model": path, "prompts": str(work / "prompts.jsonl"),
                    "init_score_head": True}
    # every timed iteration a full one (policy and value update), as after a preset's critic warm-up
    settings.update(out=str(work / "run"), tensorboard=False, quiet=True, device="cpu", dtype=args.dtype,
                    log_completions_every=0, critic_warmup_iterations=0)
    cfg = build_config(TrainConfig, settings)
    args.model, args.batch, args.minibatch = cfg.policy_model, cfg.batch_size, cfg.minibatch_size
    args.epochs, args.max_new_tokens = cfg.epochs, cfg.max_new_tokens
    trainer = PPOLoop(cfg)
    sizes = model_sizes(trainer)
    n_body, n_head, n_vbody = sizes["n_body"], sizes["n_head"], sizes["n_vbody"]
    weight_bytes = dtype.itemsize * (n_body + n_head)  # what each decoding step reads
    print(f"== model {args.model}: N (body, no embedding) {n_body / 1e6:.1f}M, H (LM head) {n_head / 1e6:.1f}M, "
          f"value body {n_vbody / 1e6:.1f}M; batch {args.batch}, minibatch {args.minibatch}, epochs {args.epochs}, "
          f"reply cap {args.max_new_tokens}")

    trainer.iteration(0)  # warm-up
    report = {"gemm_gflops": gemms, "peak_gflops": peaks, "dtype": str(dtype), "mfu_peak_gflops": peak,
              "bandwidth_gbs": bandwidth, "iterations": []}
    for index in range(1, args.iterations + 1):
        stats, rollout = trainer.iteration(index)
        B = len(rollout.prompts)
        flops = iteration_flops(rollout, trainer.micro_size, args.epochs, args.minibatch, sizes,
                                reward_model=cfg.reward_model is not None)
        gen_flops, score_flops, update_model, update_done = (flops[k] for k in ("gen", "score", "update_6N",
                                                                                  "update_4N"))
        reply_tokens, steps, scored = flops["reply_tokens"], flops["decode_steps"], flops["scored_positions"]
        update_tokens = flops["update_positions"]
        t = {k: stats[f"time_{k}"] for k in ("gen", "score", "update", "total")}
        bound_bw = B * bandwidth * 1e9 / weight_bytes  # tokens/s if each decoding step reads every weight once
        bound_compute = peak * 1e9 / (2 * (n_body + n_head))
        row = {
            "times": t, "reply_tokens": reply_tokens, "decode_steps": steps, "scored_positions": scored,
            "update_positions": update_tokens,
            "mfu_gen": gen_flops / t["gen"] / 1e9 / peak, "mfu_score": score_flops / t["score"] / 1e9 / peak,
            "mfu_update_6N": update_model / t["update"] / 1e9 / peak,
            "hfu_update_4N": update_done / t["update"] / 1e9 / peak,
            "gen_tokens_per_s": reply_tokens / t["gen"], "gen_rows_tokens_per_s": B * steps / t["gen"],
            "gen_bound_bandwidth": bound_bw, "gen_bound_compute": bound_compute,
        }
        report["iterations"].append(row)
        print(f"== iteration {index}: {t['total']:.2f} s; {reply_tokens} reply tokens, {steps} decoding steps")
        print(f"  generation {t['gen']:6.2f} s  {gen_flops / 1e12:6.3f} TFLOP  MFU {row['mfu_gen']:.1%}  "
              f"{row['gen_tokens_per_s']:.1f} reply tok/s ({row['gen_rows_tokens_per_s']:.1f} incl. finished rows); "
              f"bound: weights-read {bound_bw:.0f} tok/s, compute {bound_compute:.0f} tok/s")
        print(f"  scoring    {t['score']:6.2f} s  {score_flops / 1e12:6.3f} TFLOP  MFU {row['mfu_score']:.1%}  "
              f"({scored} positions x 3 passes{' + reward model' if cfg.reward_model else ''})")
        print(f"  update     {t['update']:6.2f} s  {update_model / 1e12:6.3f} TFLOP (6N)  MFU "
              f"{row['mfu_update_6N']:.1%}; "
              f"work done (4N + head) {update_done / 1e12:.3f} TFLOP, utilisation {row['hfu_update_4N']:.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
