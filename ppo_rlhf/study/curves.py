"""Each arm's change against KL, pooled over its seeds: the numbers of the report's figure.

For an arm (and beta) and a KL target, every seed's checkpoint picked for that target (kl_spacing.py) gives one
paired change per held-out reply against the start model; `stats.pooled_bootstrap` turns the seeds x prompts x
replies array into a mean and a 95% interval that resamples prompts (jointly for all seeds: they answer the same
prompts) and seeds. A seed whose run never reached the target is left out of that point (`seeds` says which
remain). Pure functions of the evaluation's records and summary, so that they can be tested on made-up numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppo_rlhf.ppo.kl_spacing import LAST
from ppo_rlhf.study.stats import pooled_bootstrap

# the scores whose change each point carries: the judges, the gap between what the proxy claimed and what gold saw,
# and each judge with the EOS rule (what the arm that maximises it was trained on)
SCORES = ("proxy", "gold", "length", "gap", "proxy_eos", "gold_eos", "length_eos")


def _score(record: dict[str, Any], name: str) -> float:
    return record["proxy"] - record["gold"] if name == "gap" else record[name]


def target_order(summary: list[dict[str, Any]]) -> list[float | str]:
    """Every KL target the summary's rows were picked for, increasing, LAST at the end."""
    targets = {t for row in summary for t in row.get("kl_targets", []) if t != LAST}
    return [*sorted(targets), LAST]


def arm_curves(records: list[dict[str, Any]], summary: list[dict[str, Any]], arms: dict[str, dict[str, Any]],
               n_boot: int = 10000, seed: int = 0) -> list[dict[str, Any]]:
    """One point per arm, beta and KL target: {"arm", "beta", "target", "seeds", "iterations", "kl" (the evaluation's
    KL, mean over the seeds), "finished", "tokens", "<score>_change": {"mean", "lo", "hi"} for each of SCORES}.

    `arms`: {run name: {"arm", "beta", "seed"}} (the demo's). Records and summary rows are the evaluation's."""
    by_model: dict[str, list[dict]] = {}
    for record in records:
        by_model.setdefault(record["model"], []).append(record)
    start = {(r["prompt_index"], r["reply_index"]): r for r in by_model["start"]}
    prompts = sorted({p for p, _ in start})
    replies = sorted({i for _, i in start})
    groups: dict[tuple[str, float], list[str]] = {}
    for name, run in arms.items():
        groups.setdefault((run["arm"], run["beta"]), []).append(name)
    points = []
    for (arm, beta), names in groups.items():
        for target in target_order(summary):
            rows = [row for name in names for row in summary
                    if row["run"] == name and target in row.get("kl_targets", [])]
            if not rows:
                continue
            point: dict[str, Any] = {
                "arm": arm, "beta": beta, "target": target,
                "seeds": [arms[row["run"]]["seed"] for row in rows],
                "iterations": [row["iteration"] for row in rows],
                "kl": float(np.mean([row["kl"] for row in rows])),
                "finished": float(np.mean([row["finished"] for row in rows])),
                "tokens": float(np.mean([row["tokens"] for row in rows])),
            }
            for score in SCORES:
                changes = np.empty((len(rows), len(prompts), len(replies)))
                for s, row in enumerate(rows):
                    for record in by_model[row["model"]]:
                        key = (record["prompt_index"], record["reply_index"])
                        changes[s, key[0], key[1]] = _score(record, score) - _score(start[key], score)
                mean, lo, hi = pooled_bootstrap(changes, n_boot=n_boot, seed=seed)
                point[f"{score}_change"] = {"mean": mean, "lo": lo, "hi": hi}
            points.append(point)
    return points
