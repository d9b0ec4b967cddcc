"""fp32 against bf16 on one PPO configuration, side by side: time per phase, peak RSS, and the mismatch bf16 brings.

    .venv/bin/python bench/precision_ab.py --batch 8 --minibatch 4 --max-new-tokens 24

Each side runs in its own process (peak RSS is a process's), from the same seed: a warm-up iteration (oneDNN
builds its bf16 kernels on first use), then `--iterations` timed ones. `--rounds` repeats the pair, alternating the
order. The replies differ after the first sampled token whose probabilities rounded differently, so the sides
do not run the same token counts; the table shows them.

Last run (bench/HISTORY.md, fifth session), 2026-12-03 17:00-17:05 UTC, SmolLM2, quiet machine:

    .venv/bin/python bench/precision_ab.py --batch 8 --minibatch 4 --max-new-tokens 24 --rounds 2

    fp32 / bf16: generation 7.32 / 6.14 s, scoring 7.74 / 4.72 s, update 17.91 / 15.01 s, iteration 32.98 / 25.87 s
    (bf16/fp32 0.78), peak RSS 2.50 / 1.79 GB (0.72); mismatch_kl 1.32e-11 / 1.85e-3, ratio_spread 0 in both
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch starts OpenMP (see bench/HISTORY.md)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PHASES = ("time_gen", "time_score", "time_update", "time_total")


def run_side(args: argparse.Namespace) -> dict:
    """One side, in this process: load, warm up, time; returns the means of the timed iterations."""
    from common import PROMPTS, peak_rss_gb, prepare_model

    from ppo_rlhf.config import build_config
    from ppo_rlhf.ppo.train_config import TrainConfig
    from ppo_rlhf.ppo.trainer import PPOLoop

    path = prepare_model(args.model)
    work = Path(tempfile.mkdtemp(prefix="precision_ab_"))
    (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    cfg = build_config(TrainConfig, dict(
        policy_model=path, reward_model=path, prompts=str(work / "prompts.jsonl"), out=str(work / "run"),
        batch_size=args.batch, minibatch_size=args.minibatch, max_new_tokens=args.max_new_tokens,
        tensorboard=False, quiet=True, seed=args.seed, device="cpu", dtype=args.side, init_score_head=True))
    started = time.perf_counter()
    trainer = PPOLoop(cfg)
    load_s = time.perf_counter() - started
    trainer.reward_mean, trainer.reward_std = 0.0, 1.0  # both sides alike; the normalisation pass is not timed here
    rows = [trainer.iteration(index)[0] for index in range(1 + args.iterations)][1:]
    keys = PHASES + ("len", "mismatch_kl", "ratio_spread", "approx_kl", "pg_loss")
    result = {key: sum(row[key] for row in rows) / len(rows) for key in keys}
    result.update(dtype=str(trainer.dtype), load_s=load_s, peak_rss_gb=peak_rss_gb())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--minibatch", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="pairs of runs (the order alternates)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.side:
        print(json.dumps(run_side(args)))
        return

    results: dict[str, list[dict]] = {"float32": [], "bfloat16": []}
    for round_index in range(args.rounds):
        order = ["float32", "bfloat16"] if round_index % 2 == 0 else ["bfloat16", "float32"]
        for side in order:
            argv = [sys.executable, __file__, "--side", side] + [
                f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("side", "json", "rounds")]
            out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
            results[side].append(json.loads(out.strip().splitlines()[-1]))
            print(f"round {round_index + 1} {side}: " + ", ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in results[side][-1].items()),
                flush=True)

    def mean(side: str, key: str) -> float:
        return sum(r[key] for r in results[side]) / len(results[side])

    print(f"\n{args.model}, batch {args.batch}, minibatch {args.minibatch}, cap {args.max_new_tokens}, "
          f"seed {args.seed}, {args.rounds} round(s) x {args.iterations} timed iteration(s) per side")
    print(f"{'':16s} {'float32':>10s} {'bfloat16':>10s} {'bf16/fp32':>10s}")
    for key in PHASES + ("peak_rss_gb", "load_s", "len"):
        fp32, bf16 = mean("float32", key), mean("bfloat16", key)
        print(f"{key:16s} {fp32:10.3f} {bf16:10.3f} {bf16 / fp32:10.2f}")
    for key in ("mismatch_kl", "ratio_spread", "approx_kl"):
        print(f"{key:16s} {mean('float32', key):10.2e} {mean('bfloat16', key):10.2e}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
