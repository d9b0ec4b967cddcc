"""`ppo-rlhf task`: the verifiable tasks (ppo_rlhf/tasks/arithmetic.py, calc_steps.py, and the environment tasks with
a horizon knob, horizon.py) from the command line.

    ppo-rlhf task list                                  # the tasks, a sample problem of each, how many there are
    ppo-rlhf task write add-small --out data/add-small  # DIR/train.jsonl and DIR/heldout.jsonl: {"prompt", "answer"}
    ppo-rlhf task write key-door-8 --out data/kd8       # the 8-turn key-door probe's rows (the environment's columns)
    ppo-rlhf task evaluate RUN_DIR... --level add-small --out DIR  # held-out accuracy: start, each checkpoint

Torch-free to import: `list` and `write` check and write files without loading a model; `evaluate` loads torch after
its arguments are checked.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ppo_rlhf.config import NON_NEGATIVE_INT, POSITIVE_INT, SEED, add_threads_argument
from ppo_rlhf.errors import require
from ppo_rlhf.tasks import calc_steps, guess_number, horizon, key_door
from ppo_rlhf.tasks.arithmetic import LEVELS, TASKS, Problem, check_task, split_problems, write_task
from ppo_rlhf.utils.files import atomic_write_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="the tasks, a sample problem of each, and how many problems each split has")
    write = actions.add_parser("write", help="write a task's train.jsonl and heldout.jsonl")
    write.add_argument("level", help=f"the task: {', '.join(TASKS)} (or any horizon: {horizon.families_hint()})")
    write.add_argument("--out", required=True, help="folder for train.jsonl and heldout.jsonl")
    write.add_argument("--train", type=NON_NEGATIVE_INT, default=0,
                       help=f"training problems (0 = all of them; calc-steps: {calc_steps.POOL['train']}, guess-T: "
                       f"{guess_number.POOL['train']})")
    write.add_argument("--heldout", type=NON_NEGATIVE_INT, default=0, help="held-out problems (0 = all of them; "
                       f"calc-steps: {calc_steps.POOL['heldout']}, guess-T: {guess_number.POOL['heldout']})")
    write.add_argument("--seed", type=SEED, default=0, help="seed of the order the problems are drawn in")
    write.add_argument("--overwrite", action="store_true", help="replace existing train.jsonl / heldout.jsonl")
    evaluate = actions.add_parser("evaluate", help="a run's start policy and checkpoints on held-out problems: "
                                  "exact-match accuracy and its change, with 95%% prompt-level bootstrap intervals")
    evaluate.add_argument("runs", nargs="+", metavar="RUN_DIR",
                          help="run directories from one start policy (e.g. ppo, rloo, grpo), trained on this level")
    evaluate.add_argument("--level", required=True, help=f"the task: {', '.join(TASKS)} (calc-steps: multi-turn "
                          "episodes with its calculator tool)")
    evaluate.add_argument("--out", required=True, help="folder for task_eval.json (every reply and the summary)")
    evaluate.add_argument("--heldout", type=NON_NEGATIVE_INT, default=200, metavar="N",
                          help=f"problems evaluated (0 = all of them; calc-steps: {calc_steps.POOL['heldout']} "
                               "held-out)")
    evaluate.add_argument("--split", choices=("heldout", "train"), default="heldout",
                          help="heldout (default), or train: the first N training problems, a validation split for "
                               "choosing settings without reading the held-out ones")
    evaluate.add_argument("--replies-per-prompt", type=POSITIVE_INT, default=1, help="replies sampled per problem")
    evaluate.add_argument("--checkpoints", default="all", help='"all", "latest" or iterations like 10,20')
    evaluate.add_argument("--batch-size", type=POSITIVE_INT, default=32, help="replies generated at once")
    evaluate.add_argument("--seed", type=SEED, default=1234, help="sampling seed, the same for every model")
    evaluate.add_argument("--device", default="auto", help='"auto", "cpu", "cuda" or "cuda:N"')
    add_threads_argument(evaluate)


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        for spec in LEVELS.values():
            sizes = {split: len(split_problems(spec.name, split)) for split in ("train", "heldout")}
            sample = Problem(spec.left[1], spec.op, spec.right[0])
            print(f"{spec.name:10s} {spec.description}, e.g. {sample.question} = {sample.answer} "
                  f"({sizes['train']} train, {sizes['heldout']} held-out problems)")
        pool = calc_steps.POOL
        print(f"{calc_steps.NAME:10s} a * b + c (a, b two-digit, c three-digit) in turns with a calc tool, e.g. "
              f"{calc_steps.question(37, 48, 215)} = {37 * 48 + 215} (millions of problems; write draws "
              f"{pool['train']} train, {pool['heldout']} held-out unless given counts)")
        for line in horizon_task_lines():
            print(line)
        return 0
    if args.action == "evaluate":
        return evaluate_command(args)
    train, heldout = write_task(args.level, args.out, args.train or None, args.heldout or None, args.seed,
                                args.overwrite)
    print(f"wrote {train} and {heldout}")
    return 0


def horizon_task_lines() -> list[str]:
    """The task list's lines of the environment tasks: each family, its horizons and its instances."""
    splits = {split: sum(key_door.split_of(keys, right) == split for keys, right in key_door.INSTANCES)
              for split in ("train", "heldout")}
    sizes = {key_door.NAME: f"{splits['train']:,} train, {splits['heldout']:,} held-out instances at every H",
             guess_number.NAME: f"one game per H, its secret drawn per episode; write writes "
                                f"{guess_number.POOL['train']} train, {guess_number.POOL['heldout']} held-out rows"}
    lines = []
    for name, family in horizon.FAMILIES.items():
        names = ", ".join(horizon.task_name(name, h) for h in family.HORIZONS)
        lines.append(f"{name + '-H':10s} {horizon.DESCRIPTIONS[name]}; horizon H turns: {names} (any H from "
                     f"{family.MIN_HORIZON} to {family.MAX_HORIZON}); {sizes[name]}")
    return lines


def evaluate_command(args: argparse.Namespace) -> int:
    from ppo_rlhf.tasks.evaluate import evaluate_task_runs  # lazy: torch loads after the arguments are checked

    check_task(args.level)
    out = Path(args.out)
    require(not out.exists() or out.is_dir(), f"--out {out} is a file, not a folder")
    result = evaluate_task_runs(args.runs, args.level, args.heldout or None, args.replies_per_prompt, args.checkpoints,
                               args.seed, args.batch_size, args.device, split=args.split)
    atomic_write_text(out / "task_eval.json", json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    for s in result["summary"]:
        acc, change = s["accuracy"], s["accuracy_change"]
        shares = (f"valid moves {s['valid_moves']:.0%}  turns {s['turns']:.2f}" if "valid_moves" in s
                  else f"format {s['formatted']:.0%}")  # an environment task: its moves, not an answer line
        print(f"{s['model']:24s} {'success' if 'valid_moves' in s else 'exact match'} {acc['mean']:6.1%} "
              f"[{acc['lo']:.1%}, {acc['hi']:.1%}]  change {change['mean']:+.1%} [{change['lo']:+.1%}, "
              f"{change['hi']:+.1%}]  KL {s['kl']:.2f}  {shares}  finished {s['finished']:.0%}  "
              f"{s['tokens']:.1f} tokens")
    print(f"wrote {out / 'task_eval.json'}")
    return 0

