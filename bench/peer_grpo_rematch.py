"""The rematch's results from its seeds' runs of bench/peer_grpo.py, by the plan committed before them
(bench/plans/peer_grpo_rematch.md): seed-averaged curves, `time_ratio` and `plateau_diff_points` with its interval
over seeds and problems, and bench/results/peer_grpo_rematch.json.

    .venv/bin/python bench/peer_grpo_rematch.py runs/rematch_s1 runs/rematch_s2 runs/rematch_s3 \\
        --ours ours-ppo --theirs trl-lora --results bench/results/peer_grpo_rematch.json

Each folder is one `bench/peer_grpo.py --seed N --out FOLDER` run (its peer_grpo.json and its evaluation's
records). Refused, with one line and exit 2, unless the plan file is committed and the tree is clean: the results
name the commit that last changed the plan (`plan_commit`), so a reader can check that the rule came first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_grpo import WINDOW, first_at_level, plateau, plateau_cells, plateau_rows  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PLAN = ROOT / "bench" / "plans" / "peer_grpo_rematch.md"
TIME_RULE = (f"seconds for a side's seed-averaged {WINDOW}-checkpoint moving average to first reach L (the plateau "
             "of TRL's best side's seed-averaged curve: the mean of its checkpoints from half the budget on), ours "
             "over theirs")


class PlanError(Exception):
    """The plan is not committed, or the tree has uncommitted changes."""


def plan_commit(plan: Path, repo: Path) -> str:
    """The commit that last changed `plan`, when the plan is committed and the tree is clean; else PlanError."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout

    dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    if dirty:
        raise PlanError(f"the tree has uncommitted changes ({dirty.splitlines()[0].strip()} ...): commit them first, "
                        "so that the results name the code and plan they came from")
    commit = git("log", "-1", "--format=%H", "--", str(plan.resolve().relative_to(repo.resolve()))).strip()
    if not commit:
        raise PlanError(f"{plan} is not committed: commit the plan before writing results that follow it")
    return commit


def averaged_curve(per_seed: list[list[dict]]) -> list[dict]:
    """A side's seed-averaged curve: at checkpoint index k (k < every seed's count), the mean of the seeds'
    seconds, tokens and exact match, with the seeds' labels (to find their records)."""
    count = min(len(rows) for rows in per_seed)
    return [{"iteration": k + 1, "seconds": float(np.mean([rows[k]["seconds"] for rows in per_seed])),
             "tokens": int(round(float(np.mean([rows[k]["tokens"] for rows in per_seed])))),
             "accuracy": {"mean": float(np.mean([rows[k]["accuracy"]["mean"] for rows in per_seed]))},
             "labels": [rows[k]["label"] for rows in per_seed]} for k in range(count)]


def rematch_statistics(ours: list[tuple[list[dict], list[dict]]], theirs: list[tuple[list[dict], list[dict]]],
                       budget_s: float) -> dict:
    """`ours` and `theirs`: per seed (its checkpoint rows, its evaluation's records). The plan's statistics: L,
    time_ratio (and the window-1 reading beside it), plateau_diff_points with its 95% interval pooled over seeds and
    problems (seed k of one side paired with seed k of the other)."""
    from ppo_rlhf.study.stats import pooled_bootstrap

    curve_ours, curve_theirs = averaged_curve([rows for rows, _ in ours]), averaged_curve([rows for rows, _ in theirs])
    level = plateau(curve_theirs, budget_s)
    hits = {name: (first_at_level(curve_ours, level, window), first_at_level(curve_theirs, level, window))
            for name, window in (("time", WINDOW), ("first_checkpoint", 1))}
    seeds = min(len(ours), len(theirs))
    differences = []
    for (rows_o, records_o), (rows_t, records_t) in zip(ours[:seeds], theirs[:seeds]):
        mine = plateau_cells(records_o, [row["label"] for row in plateau_rows(rows_o, budget_s)])
        their = plateau_cells(records_t, [row["label"] for row in plateau_rows(rows_t, budget_s)])
        keys = sorted(their)
        problems = sorted({key[0] for key in keys})
        replies = sorted({key[1] for key in keys})
        differences.append([[mine[(p, r)] - their[(p, r)] for r in replies] for p in problems])
    mean, lo, hi = pooled_bootstrap(np.asarray(differences))

    def ratio(pair: tuple, key: str) -> float | None:
        a, b = pair
        return None if a is None or b is None else a[key] / max(b[key], 1)

    return {"time_rule": TIME_RULE, "level": level, "plateau_ours": plateau(curve_ours, budget_s),
            "plateau_theirs": level, "time_ratio": ratio(hits["time"], "seconds"),
            "time_token_ratio": ratio(hits["time"], "tokens"),
            "first_checkpoint_ratio": ratio(hits["first_checkpoint"], "seconds"),
            "plateau_diff_points": 100 * mean, "plateau_diff_ci95": [100 * lo, 100 * hi], "paired_seeds": seeds,
            "curves": {"ours": curve_ours, "theirs": curve_theirs}}


def side_runs(folders: list[Path], side: str) -> list[tuple[list[dict], list[dict]]]:
    """(checkpoint rows, evaluation records) of `side` in each folder that ran it, in the folders' order."""
    runs = []
    for folder in folders:
        result = json.loads((folder / "peer_grpo.json").read_text())
        if side in result["curves"]:
            records = json.loads((folder / "evaluation" / "task_eval.json").read_text())["records"]
            runs.append((result["curves"][side], records))
    return runs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="one bench/peer_grpo.py --out folder per seed")
    parser.add_argument("--ours", default="ours-ppo", help="our side (default ours-ppo)")
    parser.add_argument("--theirs", default="trl-lora", help="TRL's best side, as the screening chose it")
    parser.add_argument("--plan", type=Path, default=PLAN, help="the plan these runs follow (committed)")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "peer_grpo_rematch.json")
    args = parser.parse_args(argv)
    missing = [str(f) for f in args.folders if not (f / "peer_grpo.json").is_file()]
    if missing:
        print(f"peer_grpo_rematch: no finished peer_grpo.json in {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        commit = plan_commit(args.plan, ROOT)
    except PlanError as error:
        print(f"peer_grpo_rematch: {error}", file=sys.stderr)
        return 2
    firsts = [json.loads((f / "peer_grpo.json").read_text()) for f in args.folders]
    ours, theirs = side_runs(args.folders, args.ours), side_runs(args.folders, args.theirs)
    if not ours or not theirs:
        print(f"peer_grpo_rematch: {args.ours if not ours else args.theirs} is in none of the folders",
              file=sys.stderr)
        return 2
    budget = float(firsts[0]["args"]["budget_s"])
    statistics = rematch_statistics(ours, theirs, budget)
    curves = statistics.pop("curves")
    seeds: dict[str, int] = {}
    for result in firsts:
        for side in result["curves"]:
            seeds[side] = seeds.get(side, 0) + 1
    from ppo_rlhf.models.precision import cpu_matrix_flags

    out = {"plan_commit": commit, "cpu_flags": cpu_matrix_flags().split(),
           "seeds": seeds, "trl_precision": firsts[0]["args"]["trl_precision"],
           "statistics": statistics, "curves": curves, "folders": [str(f) for f in args.folders]}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(out, indent=1) + "\n")
    diff, (lo, hi) = statistics["plateau_diff_points"], statistics["plateau_diff_ci95"]
    ratio = statistics["time_ratio"]
    print(f"plan {commit[:12]}; L {statistics['level']:.1%}; time_ratio "
          f"{'never reached' if ratio is None else f'{ratio:.2f}'}; plateau {args.ours} - {args.theirs} "
          f"{diff:+.1f} [{lo:+.1f}, {hi:+.1f}] points over {statistics['paired_seeds']} seeds and the problems")
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
