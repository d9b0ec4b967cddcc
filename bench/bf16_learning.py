"""Does bf16 change what PPO learns? The same short PPO run in fp32 and in bf16, several seeds each, side by side.

    .venv/bin/python bench/bf16_learning.py --reward-model runs/demo/reward_model --seeds 1,2,3

Policy SmolLM2 against a fixed reward model (the demo's proxy by default: trained once, then frozen), the same
prompts, `--iterations` iterations per run. Each run is a `ppo-rlhf train` run of its own process, so one run's
memory and threads do not touch the next. The raw reward-model score of each iteration's replies (history `rm_raw`)
is the learning curve. The verdict compares the two dtypes' mean score over the last `--tail` iterations with the
seed-to-seed spread of that same number within each dtype: the difference of the dtype means against the larger of
the two seed standard deviations. bench/HISTORY.md holds a run's numbers; OUT/curves.png the curves.

Last run (bench/HISTORY.md, ninth session), 2026-12-04 08:47-10:56 UTC, against a fresh demo reward model:

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python bench/bf16_learning.py \
        --reward-model runs/demo/reward_model --prompts runs/demo/prompts/ppo.jsonl --seeds 1,2,3,4,5,6,7,8 \
        --iterations 20 --batch 4 --minibatch 2 --max-new-tokens 32

    mean raw score, first 5 -> last 5 iterations: float32 -0.680 -> 0.639 (+1.32, seed sd 0.643), bfloat16 -0.527 ->
    0.142 (+0.67, seed sd 0.555); bf16 - fp32 over the last 5: -0.496, within the seed-to-seed spread
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DTYPES = ("float32", "bfloat16")


def run_one(args: argparse.Namespace, dtype: str, seed: int) -> list[dict]:
    """One training run (its own process); returns its history rows (reused when the run already finished)."""
    out = Path(args.out) / f"{dtype}_seed{seed}"
    history = out / "history.jsonl"
    if history.is_file() and len(history.read_text().splitlines()) >= args.iterations:
        return [json.loads(line) for line in history.read_text().splitlines()]
    config = dict(policy_model=args.model, reward_model=str(Path(args.reward_model).resolve()),
                  prompts=str(Path(args.prompts).resolve()), out=str(out.resolve()), overwrite=True, seed=seed,
                  dtype=dtype, iterations=args.iterations, batch_size=args.batch, minibatch_size=args.minibatch,
                  max_new_tokens=args.max_new_tokens, reward_norm_samples=args.batch * 2, policy_lr=1e-4,
                  value_lr=1e-4, checkpoint_every=args.iterations, tensorboard=False, quiet=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    config_file = out.parent / f"{dtype}_seed{seed}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    subprocess.run([sys.executable, "-m", "ppo_rlhf", "train", "--config", str(config_file)], check=True, cwd=ROOT)
    return [json.loads(line) for line in history.read_text().splitlines()]


def plot(curves: dict[str, dict[int, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (dtype, runs), color in zip(curves.items(), ("tab:blue", "tab:orange")):
        for k, (seed, scores) in enumerate(runs.items()):
            ax.plot(range(len(scores)), scores, color=color, alpha=0.8, marker="o" if dtype == "float32" else "s",
                    markersize=3, label=dtype if k == 0 else None)
    ax.set_xlabel("PPO iteration")
    ax.set_ylabel("reward-model score of the replies (raw)")
    ax.set_title("The same PPO runs in fp32 and bf16 (one line per seed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--reward-model", default="runs/demo/reward_model", help="a frozen reward-model folder")
    parser.add_argument("--prompts", default="runs/demo/prompts/ppo.jsonl", help="prompts JSONL")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--minibatch", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--tail", type=int, default=5, help="last iterations averaged for the verdict")
    parser.add_argument("--out", default="runs/bf16_learning")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]

    curves: dict[str, dict[int, list[float]]] = {dtype: {} for dtype in DTYPES}
    for seed in seeds:  # dtypes alternate, so a slow spell of the machine hits both
        for dtype in DTYPES:
            rows = run_one(args, dtype, seed)
            curves[dtype][seed] = [row["rm_raw"] for row in rows]
            print(f"{dtype} seed {seed}: rm_raw " + " ".join(f"{x:+.2f}" for x in curves[dtype][seed]), flush=True)

    tails = {dtype: [statistics.fmean(c[-args.tail:]) for c in curves[dtype].values()] for dtype in DTYPES}
    firsts = {dtype: [c[0] for c in curves[dtype].values()] for dtype in DTYPES}
    print(f"\nmean raw score, {len(seeds)} seeds, {args.iterations} iterations of {args.batch} replies (cap "
          f"{args.max_new_tokens}):")
    print(f"{'':10s} {'iteration 0':>12s} {f'last {args.tail}':>10s} {'seed sd':>8s}")
    for dtype in DTYPES:
        print(f"{dtype:10s} {statistics.fmean(firsts[dtype]):12.3f} {statistics.fmean(tails[dtype]):10.3f} "
              f"{statistics.stdev(tails[dtype]):8.3f}")
    gap = statistics.fmean(tails["bfloat16"]) - statistics.fmean(tails["float32"])
    spread = max(statistics.stdev(tails[dtype]) for dtype in DTYPES)
    within = abs(gap) <= spread
    print(f"bf16 - fp32 over the last {args.tail} iterations: {gap:+.3f}; the larger seed sd: {spread:.3f}: "
          + ("within the seed-to-seed spread" if within else "OUTSIDE the seed-to-seed spread"))
    out = Path(args.out)
    (out / "summary.json").write_text(json.dumps({"curves": curves, "tails": tails, "gap": gap, "spread": spread,
                                                  "within": within, "settings": vars(args)}, indent=1))
    plot(curves, out / "curves.png")
    print(f"wrote {out / 'summary.json'} and {out / 'curves.png'}")


if __name__ == "__main__":
    main()
