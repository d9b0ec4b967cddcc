"""`ppo-rlhf compare`: the same budget with each advantage estimator (GAE/PPO, RLOO, GRPO), then a held-out
evaluation of all of them with the proxy and the gold judge, side by side.

Every run gets the same config (same prompts, seed, batch of replies, iterations, group_size) except
`advantage_estimator`, and goes to OUT/<estimator>; the evaluation (`evaluate.evaluate_runs`, last checkpoints)
goes to OUT/evaluation, and the side-by-side table to OUT/compare.txt and compare.json.

`--task LEVEL` compares instead ppo, ppo with a critic warm-up, rloo and grpo on a verifiable task, each trained in
its own process and scored exactly on held-out problems, with a plot and a sentence from the numbers
(`ppo_rlhf.tasks.compare`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ppo_rlhf.config import (
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    SEED,
    add_config_arguments,
    build_config,
    field_types,
    read_yaml,
)
from ppo_rlhf.errors import require
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.study.evaluate import evaluate_runs
from ppo_rlhf.study.judge_specs import check_judge_spec
from ppo_rlhf.study.prompts import read_prompts
from ppo_rlhf.train import train

ESTIMATORS = field_types(TrainConfig)["advantage_estimator"].choices  # (objectives.py imports torch)
DEFAULT_ESTIMATORS = ("gae", "rloo", "grpo")  # ev-gated is a mix of gae and rloo: compared when named


def compare_configs(base: dict[str, Any], out: str | Path, estimators: list[str]) -> dict[str, Any]:
    """One TrainConfig per estimator; a group_size of 1 becomes 2 for all (rloo/grpo need groups, and every
    estimator must see the same prompts)."""
    for name in estimators:
        require(name in ESTIMATORS, f"unknown estimator {name!r}; choose from {', '.join(ESTIMATORS)}")
    require(len(set(estimators)) == len(estimators), "each estimator once")
    group = max(int(base.get("group_size", 1)), 2)
    configs = {name: build_config(TrainConfig, base, {"advantage_estimator": name, "group_size": group,
                                                      "out": str(Path(out) / name)})
               for name in estimators}
    for config in configs.values():  # before hours of training: what a run needs, and its files
        config.require_inputs(flags=True)
        config.check_files()
    return configs


def side_by_side(summary: list[dict[str, Any]]) -> str:
    def cell(s: dict, judge: str) -> str:
        c = s[f"{judge}_change"]
        return f"{c['mean']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}]"

    lines = [f"{'model':<22} {'proxy change (start sd)':<28} {'gold change (start sd)':<28} {'kl':>7} {'tokens':>7} "
             f"{'fin':>5}"]
    for s in summary:
        lines.append(f"{s['model']:<22} {cell(s, 'proxy'):<28} {cell(s, 'gold'):<28} {s['kl']:>7.3f} "
                     f"{s['tokens']:>7.1f} {s['finished']:>5.2f}")
    return "\n".join(lines) + "\n"


def compare(base: dict[str, Any], out: str | Path, estimators: list[str], eval_prompts: str, gold: str = "gold",
            replies_per_prompt: int = 2, seed: int = 1234, overwrite: bool = False) -> dict[str, Any]:
    out = Path(out)
    configs = compare_configs({**base, "overwrite": overwrite}, out, estimators)
    require(bool(eval_prompts), "--eval-prompts is required (held-out prompts, a JSONL file), unless --task")
    read_prompts(eval_prompts)  # fail before hours of training
    check_judge_spec(gold)
    runs = [train(cfg) for cfg in configs.values()]
    result = evaluate_runs(runs, eval_prompts, out / "evaluation", gold=gold, replies_per_prompt=replies_per_prompt,
                           seed=seed, checkpoints="latest", device=next(iter(configs.values())).device)
    table = side_by_side(result["summary"])
    (out / "compare.txt").write_text(table)
    (out / "compare.json").write_text(json.dumps({"estimators": estimators, "runs": [str(r.resolve()) for r in runs],
                                                  "summary": result["summary"]}, indent=1) + "\n")
    return {"table": table, "summary": result["summary"], "runs": runs}


USAGE = "%(prog)s (--eval-prompts FILE | --task LEVEL) [--config FILE] [--OPTION VALUE ...]"
DESCRIPTION = """\
The same training budget with each advantage estimator (GAE/PPO, RLOO, GRPO), then a held-out evaluation of every run
with the proxy reward and the gold judge, side by side (OUT/compare.txt).

examples:
  ppo-rlhf compare --config configs/smollm2_offline.yaml --eval-prompts heldout.jsonl --out runs/compare
  ppo-rlhf compare --task add-tiny --out runs/compare-add   (ppo, ppo-warmup, rloo, grpo on a verifiable task)

The training options set every run (each of them also a key of the --config YAML file); --out is the folder of the
runs, one subfolder per estimator."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage, parser.description = USAGE, DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--config", metavar="FILE", help="base YAML config of `ppo-rlhf train`; flags override it "
                                                         "(with --task: default configs/smollm2_add_tiny.yaml)")
    parser.add_argument("--task", metavar="LEVEL", help="a verifiable task level (ppo-rlhf task list): compare ppo, "
                        "ppo-warmup, rloo and grpo on it, scored exactly on held-out problems")
    comparison = parser.add_argument_group("the comparison")
    comparison.add_argument("--estimators", metavar="NAME,NAME", help="comma-separated, from gae, rloo, grpo, "
                                                                      "ev-gated (default: gae, rloo, grpo; not with "
                                                                      "--task)")
    comparison.add_argument("--eval-prompts", metavar="FILE", help='held-out prompts, a {"prompt": ...} JSONL file '
                                                                   '(required without --task)')
    comparison.add_argument("--gold", metavar="JUDGE", help="gold judge: gold, vader, nontoxic or rm:PATH_OR_ID "
                                                            "(default gold; not with --task)")
    comparison.add_argument("--replies-per-prompt", type=POSITIVE_INT, metavar="N",
                            help="evaluation replies per held-out prompt (default 2; with --task 1)")
    comparison.add_argument("--eval-seed", type=SEED, default=1234, metavar="N",
                            help="seed of the evaluation's sampling (default 1234)")
    comparison.add_argument("--variants", metavar="NAME,NAME",
                            help="with --task: comma-separated, from ppo, ppo-warmup, ppo-turn, ev-gated, rloo, grpo "
                                 "(default ppo, ppo-warmup, rloo, grpo; with --horizons ppo, ppo-turn, ev-gated, "
                                 "rloo, grpo)")
    comparison.add_argument("--checkpoints", metavar="N,N", help="with --task: iterations evaluated, like 10,20,30 "
                                                                 "(default every 10th and the last)")
    comparison.add_argument("--heldout", type=NON_NEGATIVE_INT, metavar="N",
                            help="with --task: held-out problems evaluated (default 200; 0 = all of them)")
    comparison.add_argument("--horizons", metavar="H,H", help="with --task: horizons like 2,4,8 (the task's "
                                                              "instances NAME-H): every variant at each, --seeds runs "
                                                              "each")
    comparison.add_argument("--seeds", type=POSITIVE_INT, metavar="N",
                            help="with --horizons: training runs per variant and horizon, seeds seed, seed+1, ... "
                                 "(default 3)")
    comparison.add_argument("--json-out", metavar="FILE", help="with --horizons: where critic_horizon.json goes "
                                                               "(default OUT/critic_horizon.json)")
    comparison.add_argument("--screen", action="store_true", default=None,
                            help="with --horizons: first choose each variant's settings on a validation split of the "
                                 "training instances, written to OUT/screen/chosen.json")
    comparison.add_argument("--archive", metavar="DIR",
                            help="with --horizons: keep every finished run (its config, history and held-out records, "
                                 "not its checkpoints) in DIR too, and take the runs DIR holds as done: a comparison "
                                 "that spans machines")
    add_config_arguments(parser, TrainConfig, title="training: {}")  # --out is the parent folder of the runs


def run(args: argparse.Namespace) -> int:
    """`ppo-rlhf compare` (with --task the CLI runs `ppo_rlhf.tasks.compare.run` instead)."""
    task_only = [flag for flag, value in (("--variants", args.variants), ("--checkpoints", args.checkpoints),
                                          ("--heldout", args.heldout), ("--horizons", args.horizons),
                                          ("--seeds", args.seeds), ("--json-out", args.json_out),
                                          ("--screen", args.screen), ("--archive", args.archive))
                 if value is not None]
    require(not task_only, f"{', '.join(task_only)}: only with --task")
    names = set(TrainConfig.__dataclass_fields__)
    base = read_yaml(args.config) if args.config else {}
    base.update({k: v for k, v in vars(args).items() if k in names})
    out = base.pop("out", "runs/compare")
    overwrite = bool(base.pop("overwrite", False))
    estimators = [e.strip() for e in (args.estimators or ",".join(DEFAULT_ESTIMATORS)).split(",") if e.strip()]
    result = compare(base, out, estimators, args.eval_prompts, args.gold or "gold", args.replies_per_prompt or 2,
                     args.eval_seed, overwrite)
    print(result["table"], end="")
    return 0
