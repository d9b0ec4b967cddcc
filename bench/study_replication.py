"""Does the study's proxy beat word counts in more than one pool? The demo's stages before PPO (prompts, pairs, the
proxy reward model) once per data seed, each pool in its own folder, then the proxy's held-out numbers per pool and
pooled with the pool as the unit.

    .venv/bin/python bench/study_replication.py --data-seeds 1,2,3 --out runs/replication
    .venv/bin/python bench/study_replication.py --data-seeds 1,2,3 --out runs/replication -- --rm-length-head
    .venv/bin/python bench/study_replication.py --data-seeds 1,2,3 --out runs/replication --report-only

A data seed draws the prompts (train and held-out candidates) and samples the replies the gold judge pairs
(`ppo-rlhf demo --data-seed`); the reward model trains with the demo's `--seed`, the same in every pool. Arguments
after `--` are `ppo-rlhf demo`'s settings (the reward model's, the pairs'), the same for every pool. Each pool's
stages are the demo's own, keyed and resumable: a killed replication run again continues where it stopped, and a
pool's folder is a `make demo` folder up to its reward model (`ppo-rlhf demo --out POOL` continues it to the end).

Per pool (rm_info.json of its reward model): training and held-out pairs, the proxy's held-out accuracy, word
counts' (a bag-of-words logistic regression on the same training pairs), RM - words with its 95% interval that
resamples held-out prompts, similar-length accuracy and the score-length correlation, and the CPU flags of the
machine that measured it. Pooled: the mean of the pools' RM - words and a Student-t 95% interval over pools
(`study.stats.unit_interval`): a pool is to this claim what a training seed is to a learning curve, and the prompts
within one pool say nothing about another. Writes OUT/study_replication.json (`bench/results/study_replication.json`
is a copy of the measured run's).

`--archive DIR` (a replication that spans machines, whose disks may not outlive a sitting): each finished pool's row
is also kept in DIR/pool_SEED.json, and a pool whose row DIR holds is taken from there, not sampled again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ppo_rlhf.config import build_config
from ppo_rlhf.errors import UsageError
from ppo_rlhf.models.precision import cpu_matrix_flags
from ppo_rlhf.study.demo import DemoConfig, Stages, data_stages, given_settings
from ppo_rlhf.study.stats import unit_interval
from ppo_rlhf.utils.files import atomic_write_text

METHOD = ("mean of the pools' RM - words; 95% Student-t interval over pools (n - 1 degrees of freedom); each pool's "
          "own interval resamples its held-out prompts")


def pool_row(data_seed: int, rm_info: dict) -> dict:
    """One pool's numbers, from its reward model's rm_info.json, and this machine's CPU flags."""
    heldout = rm_info["heldout"]
    mean, lo, hi = heldout["rm_minus_words"]
    similar = heldout["similar_length"]["accuracy"]
    return {"data_seed": data_seed, "cpu_flags": cpu_matrix_flags().split(), "pairs": rm_info["train_pairs"],
            "heldout_pairs": rm_info["heldout_pairs"],
            "rm_accuracy": heldout["all"]["accuracy"][0], "words_accuracy": heldout["words"]["accuracy"][0],
            "rm_minus_words": mean, "ci95": [lo, hi], "score_length_corr": heldout["reply_length_corr"],
            "similar_length_accuracy": None if similar is None else similar[0],
            "similar_length_pairs": heldout["similar_length"]["pairs"]}


def summary(pools: list[dict], flags: list[str], settings: dict) -> dict:
    mean, lo, hi = unit_interval([pool["rm_minus_words"] for pool in pools])
    return {"cpu_flags": flags, "settings": settings, "pools": pools,
            "pooled": {"rm_minus_words": mean, "ci95": [lo, hi], "pools": len(pools), "method": METHOD}}


def print_summary(result: dict) -> None:
    print(f"\n{'data seed':>9s} {'pairs':>6s} {'held-out':>8s} {'RM':>5s} {'words':>5s}  {'RM - words [95%]':24s} "
          f"{'similar-length':>14s} {'score-length r':>14s}")
    for pool in result["pools"]:
        lo, hi = pool["ci95"]
        similar = pool["similar_length_accuracy"]
        corr = pool["score_length_corr"]
        print(f"{pool['data_seed']:9d} {pool['pairs']:6d} {pool['heldout_pairs']:8d} {pool['rm_accuracy']:5.2f} "
              f"{pool['words_accuracy']:5.2f}  {pool['rm_minus_words']:+.3f} [{lo:+.3f}, {hi:+.3f}]     "
              f"{'n/a' if similar is None else f'{similar:.2f}':>14s} {'n/a' if corr is None else f'{corr:+.2f}':>14s}")
    pooled = result["pooled"]
    lo, hi = pooled["ci95"]
    print(f"pooled over {pooled['pools']} pools: RM - words {pooled['rm_minus_words']:+.3f} [{lo:+.3f}, {hi:+.3f}] "
          f"({pooled['method']})")


def main(argv: list[str]) -> int:
    cut = argv.index("--") if "--" in argv else len(argv)
    ours, demo_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-seeds", default="1,2,3", help="comma-separated data seeds, one pool each")
    parser.add_argument("--out", default="runs/replication", help="folder: OUT/pool_SEED/ per pool, and the summary")
    parser.add_argument("--report-only", action="store_true", help="summarise the finished pools, run nothing")
    parser.add_argument("--archive", help="folder that keeps each finished pool's row (DIR/pool_SEED.json); a pool "
                                          "found there is not sampled again")
    args = parser.parse_args(ours)
    try:
        seeds = [int(part) for part in args.data_seeds.split(",") if part.strip()]
    except ValueError:
        parser.error(f"--data-seeds must be integers like 1,2,3; got {args.data_seeds!r}")
    if not seeds or len(set(seeds)) != len(seeds):
        parser.error(f"--data-seeds must be distinct integers; got {args.data_seeds!r}")
    from ppo_rlhf.cli import build_parser  # the demo's own flags, parsed as `ppo-rlhf demo` parses them

    try:
        given = given_settings(build_parser(only="demo").parse_args(["demo", *demo_args]))
    except UsageError as error:
        print(f"ppo-rlhf demo settings: {error}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    archive = Path(args.archive).resolve() if args.archive else None
    pools = []
    for data_seed in seeds:
        folder = out / f"pool_{data_seed}"
        info_file = folder / "reward_model" / "rm_info.json"
        kept = archive / f"pool_{data_seed}.json" if archive else None
        if kept is not None and kept.is_file():
            pools.append(json.loads(kept.read_text()))
            print(f"== pool {data_seed}: from the archive {kept}", flush=True)
            continue
        if not args.report_only:
            try:
                cfg = build_config(DemoConfig, given, {"out": str(folder), "data_seed": data_seed})
            except UsageError as error:
                print(f"ppo-rlhf demo settings: {error}", file=sys.stderr)
                return 2
            start = time.perf_counter()
            print(f"== pool with data seed {data_seed}: {folder}", flush=True)
            data_stages(cfg, Stages(folder), folder)
            print(f"== pool {data_seed}: {time.perf_counter() - start:.0f} s this time", flush=True)
        if not info_file.is_file():
            print(f"pool {data_seed}: no finished reward model in {folder} (run without --report-only)",
                  file=sys.stderr)
            return 2
        pools.append(pool_row(data_seed, json.loads(info_file.read_text())))
        if kept is not None:
            atomic_write_text(kept, json.dumps(pools[-1], indent=1) + "\n")
    settings = {key: value for key, value in given.items() if key != "out"}
    result = summary(pools, cpu_matrix_flags().split(), settings)
    atomic_write_text(out / "study_replication.json", json.dumps(result, indent=1) + "\n")
    print_summary(result)
    print(f"wrote {out / 'study_replication.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
