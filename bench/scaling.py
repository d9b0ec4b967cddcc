"""How one PPO iteration's time and peak memory grow with reply cap, batch and model size, ours and TRL 1.12 side by
side, with the fitted exponent of each phase.

    .venv/bin/python bench/scaling.py --out runs/scaling                 # the grid below, both sides, resumable
    .venv/bin/python bench/scaling.py --out runs/scaling --table         # only the table and the fits of what ran

The grid changes one factor at a time from a base (batch 8, minibatch 4, reply cap 48, SmolLM2-135M's shape):
    cap     48, 128, 256           at batch 8
    batch   8, 32, 64              at cap 48 (minibatch = batch / 2)
    model   smollm2-shape, qwen-shape, qwen1.5b-shape (random weights with SmolLM2-135M's, Qwen2.5-0.5B's and
            Qwen2.5-1.5B's exact shapes, bench/common.py's RANDOM_SHAPES) at batch 8, cap 48
Every model has random weights, so every reply runs to the cap and the cap is the reply length on both sides (a
real model's replies end at varied lengths, which would mix the growth with the length distribution). The update
runs micro-batches of 4 rows everywhere (both sides), so memory measures what a user holding micro-batches fixed
sees; scoring passes take the whole batch at once (peer_trl.py's setting, both sides).

One point = one configuration, each side run once as bench/peer_trl.py's `--side` subprocess (0 warm-up, 1 timed
iteration: generation, scoring and update seconds, peak RSS by getrusage), the order of the two sides alternating
from point to point. Each finished side appends a line to OUT/points.jsonl; a re-run skips what is there, so a
killed run continues. The fit: for each factor and phase, the least-squares slope of log(seconds) on log(factor)
over the factor's points, i.e. k in seconds ~ factor^k (model size: its parameter count); the same for peak RSS.
Run it on a quiet machine; the CPU's flags are printed first (AMX, AVX512-BF16 or AVX2 only).

Last run (2026-12-05 12:04-13:17 UTC, AVX2-only AMD EPYC, fp32 both sides): every point ran; generation grows
fastest with the cap (k 0.71 ours, 0.87 TRL), scoring and update with batch; ours/TRL 0.86-0.99 in time except the
smallest point (1.40, which did not reproduce: 0.96 over three iterations a side at 15:04-15:14), 0.54-0.71 in
memory (bench/HISTORY.md, 2026-12-05, on an AVX2-only CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]

from common import prepare_model  # noqa: E402
from peer_trl import MALLOC_SETTINGS, OURS_PY, TRL_PY, side_flags, summarise  # noqa: E402

from ppo_rlhf.models.precision import cpu_matrix_flags  # noqa: E402

BASE = {"model": "smollm2-shape", "batch": 8, "cap": 48}
PHASES = ("gen", "score", "update", "total")


def grid(caps: list[int], batches: list[int], models: list[str]) -> list[dict]:
    """The points, base first, then each factor's other values (cheapest first within a factor)."""
    points = [dict(BASE)]
    for factor, values in (("cap", caps), ("batch", batches), ("model", models)):
        for value in values:
            point = {**BASE, factor: value}
            if point not in points:
                points.append(point)
    return points


def key(point: dict, side: str) -> str:
    return f"{point['model']} b{point['batch']} cap{point['cap']} {side}"


def run_side(point: dict, side: str, args, env: dict) -> dict:
    """One side of one point, in its own process (bench/peer_trl.py --side)."""
    batch = point["batch"]
    common = ["--model-path", prepare_model(point["model"]), "--batch", str(batch), "--minibatch", str(batch // 2),
              "--epochs", "2", "--micro-batch", str(args.micro_batch), "--max-new-tokens", str(point["cap"]),
              "--temperature", "0.7", "--warmup", "0", "--iterations", "1", "--seed", "1"]
    flags = side_flags("ours-generation" if side == "ours" else f"trl-{args.trl_mode}", args)
    python = OURS_PY if side == "ours" else TRL_PY
    proc = subprocess.run([str(python), str(ROOT / "bench" / "peer_trl.py"), *flags, *common], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"failed": f"exit {proc.returncode}: {tail[0][:300]}"}
    return summarise(json.loads(line[len("RESULT "):]))


def parameter_count(model: str) -> int:
    """The model's parameters, counted on the meta device (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(prepare_model(model))
    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y on log x."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def report(records: dict, caps: list[int], batches: list[int], models: list[str]) -> str:
    """The table of every point that ran and, per factor with >= 2 points on both sides' axis, the exponents."""
    lines = ["| model | batch | cap | side | gen s | score s | update s | total s | reply len | peak RSS GB |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for point in grid(caps, batches, models):
        for side in ("ours", "trl"):
            r = records.get(key(point, side))
            if r is None:
                continue
            if "failed" in r:
                lines.append(f"| {point['model']} | {point['batch']} | {point['cap']} | {side} | "
                             f"failed: {r['failed']} |||||")
                continue
            lines.append(f"| {point['model']} | {point['batch']} | {point['cap']} | {side} | {r['gen']:.1f} | "
                         f"{r['score']:.1f} | {r['update']:.1f} | {r['total']:.1f} | {r['len']:.1f} | "
                         f"{r['peak_rss_gb']:.2f} |")
    lines += ["", "Fitted exponents k (seconds or GB ~ factor^k, least squares on log-log over the factor's points):",
              "", "| factor (points) | side | gen | score | update | total | peak RSS | fastest-growing phase |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    sizes: dict[str, int] = {}
    for factor, values in (("cap", caps), ("batch", batches), ("model", models)):
        for side in ("ours", "trl"):
            xs, rows = [], []
            for value in values:
                r = records.get(key({**BASE, factor: value}, side))
                if r is None or "failed" in r:
                    continue
                if factor == "model":
                    sizes.setdefault(value, parameter_count(value))
                xs.append(sizes[value] if factor == "model" else value)
                rows.append(r)
            if len(xs) < 2:
                continue
            fits = {phase: slope(xs, [r[phase] for r in rows]) for phase in PHASES}
            memory = slope(xs, [r["peak_rss_gb"] for r in rows])
            fastest = max(("gen", "score", "update"), key=fits.get)
            label = ", ".join(f"{x / 1e6:.0f}M" if factor == "model" else str(x) for x in xs)
            lines.append(f"| {factor} ({label}) | {side} | {fits['gen']:.2f} | {fits['score']:.2f} | "
                         f"{fits['update']:.2f} | {fits['total']:.2f} | {memory:.2f} | {fastest} |")
    return "\n".join(lines)


def read_records(path: Path) -> dict:
    records = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                records[record["key"]] = record["result"]
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder of points.jsonl")
    parser.add_argument("--caps", default="48,128,256")
    parser.add_argument("--batches", default="8,32,64")
    parser.add_argument("--models", default="smollm2-shape,qwen-shape,qwen1.5b-shape")
    parser.add_argument("--sides", default="ours,trl", help="ours, trl or both")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="ours")
    parser.add_argument("--trl-mode", default="fp32", choices=["fp32", "bf16", "bf16-weights"], help="TRL's")
    parser.add_argument("--micro-batch", type=int, default=4, help="rows per forward+backward in the update, both")
    parser.add_argument("--logprob-chunk-mb", type=float, default=128.0, help="ours (bench/peer_trl.py's flag)")
    parser.add_argument("--padding-free", action="store_true", help="ours: padding_free: true")
    parser.add_argument("--keep-finished", action="store_true", help="ours: generation_drop_finished: false")
    parser.add_argument("--malloc", choices=list(MALLOC_SETTINGS), default="default")
    parser.add_argument("--table", action="store_true", help="print the table and fits of what ran, run nothing")
    args = parser.parse_args(argv)
    caps = [int(v) for v in args.caps.split(",")]
    batches = [int(v) for v in args.batches.split(",")]
    models = args.models.split(",")
    sides = args.sides.split(",")
    if any(b % 2 or (b // 2) % args.micro_batch for b in batches):
        parser.error(f"every batch / 2 must be a multiple of --micro-batch {args.micro_batch}: {args.batches}")
    if any(side not in ("ours", "trl") for side in sides):
        parser.error(f"--sides: ours, trl or both, got {args.sides}")
    if "trl" in sides and not TRL_PY.exists():
        raise SystemExit(f"{TRL_PY} missing: see bench/HISTORY.md to create the TRL environment")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "points.jsonl"
    records = read_records(path)
    print(f"CPU flags: {cpu_matrix_flags()}; ours {args.dtype}"
          f"{', padding-free' if args.padding_free else ''}{', keep-finished' if args.keep_finished else ''}; "
          f"TRL {args.trl_mode}; micro-batch {args.micro_batch}; allocator {args.malloc}", flush=True)
    if not args.table:
        env = {"OMP_WAIT_POLICY": "PASSIVE", "TRL_EXPERIMENTAL_SILENCE": "1", **os.environ, "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", **MALLOC_SETTINGS[args.malloc]}
        for index, point in enumerate(grid(caps, batches, models)):
            for side in sides if index % 2 == 0 else sides[::-1]:
                if key(point, side) in records:
                    continue
                started = time.perf_counter()
                result = run_side(point, side, args, env)
                records[key(point, side)] = result
                with path.open("a") as file:
                    file.write(json.dumps({"key": key(point, side), "point": point, "side": side, "result": result,
                                           "at": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}) + "\n")
                shown = result.get("failed") or (f"{result['total']:.1f} s/it (gen {result['gen']:.1f}, score "
                                                  f"{result['score']:.1f}, update {result['update']:.1f}), peak RSS "
                                                  f"{result['peak_rss_gb']:.2f} GB")
                print(f"{key(point, side)}: {shown}, wall {time.perf_counter() - started:.0f} s", flush=True)
    print(report(records, caps, batches, models))
    return 0


if __name__ == "__main__":
    sys.exit(main())
