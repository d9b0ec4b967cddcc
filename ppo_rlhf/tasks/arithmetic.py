"""Verifiable tasks generated offline: arithmetic problems whose reward is true by construction.

    ppo-rlhf task list                                  # the tasks, a sample problem of each, how many there are
    ppo-rlhf task write add-small --out data/add-small  # DIR/train.jsonl and DIR/heldout.jsonl: {"prompt", "answer"}
    ppo-rlhf task evaluate RUN_DIR... --level add-small --out DIR  # held-out accuracy: start, each checkpoint

The multi-turn task `calc-steps` (ppo_rlhf.tasks.calc_steps: a * b + c with a calculator tool) goes through the same
commands and functions (`problems`, `write_task`, `check_task`, `task_tools`); its held-out evaluation runs episodes
with the tool.

Each level is a finite family of problems ("37 + 5"). Which split a problem belongs to is a function of the problem
alone (a hash of its canonical form: "5 + 37" is the same problem), so no seed, count or level setting can put a
held-out problem in a training file. `problems(level, split, n, seed)` draws n of a split's problems in a seeded order.

The rewards follow TRL's reward-function convention (`f(prompts, completions, completion_ids, **columns)`):
`exact_match` is 1.0 when the reply's answer equals the `answer` column exactly, else 0.0; `answer_format` (a
separate function, so the trainer reports it separately; weight it `FORMAT_WEIGHT`) is 1.0 when the reply ends with
the asked-for line "Answer: <integer>". A reply's answer is the integer of its last "Answer:" line or, without one,
its last integer: SmolLM2-135M-Instruct rarely writes the line at the start, and the exact checker should measure
arithmetic, with the format taught by its own small term.

Torch-free: the command checks and writes files without loading a model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ppo_rlhf.config import NON_NEGATIVE_INT, POSITIVE_INT, SEED
from ppo_rlhf.errors import require
from ppo_rlhf.tasks import calc_steps
from ppo_rlhf.utils.files import atomic_write_text

Split = Literal["train", "heldout"]
HELDOUT_SHARE = 0.3
"""Share of each level's problems that are held out (by the hash of the problem, not by drawing)."""
FORMAT_WEIGHT = 0.1
"""The format term's weight next to exact_match's 1: small, so a well-formatted wrong answer earns little."""
PROMPT = 'What is {question}? End your reply with the line "Answer: <number>".'


@dataclass(frozen=True)
class Level:
    """Every problem `a op b` with a in `left` and b in `right` (inclusive ranges)."""

    name: str
    description: str
    left: tuple[int, int]
    op: Literal["+", "-", "*"]
    right: tuple[int, int]

    def operand_pairs(self) -> list[tuple[int, int]]:
        pairs = [(a, b) for a in range(self.left[0], self.left[1] + 1) for b in range(self.right[0], self.right[1] + 1)]
        return [(a, b) for a, b in pairs if self.op != "-" or a >= b]  # no negative answers


LEVELS = {level.name: level for level in (
    Level("add-tiny", "two numbers from 0 to 30 added", (0, 30), "+", (0, 30)),
    Level("add-small", "a two-digit number plus a one-digit number", (10, 99), "+", (1, 9)),
    Level("add", "two two-digit numbers added", (10, 99), "+", (10, 99)),
    Level("sub-small", "a two-digit number minus a one-digit number", (10, 99), "-", (1, 9)),
    Level("mul-small", "a two-digit number times a one-digit number", (10, 99), "*", (2, 9)),
)}


@dataclass(frozen=True)
class Problem:
    a: int
    op: str
    b: int

    @property
    def question(self) -> str:
        return f"{self.a} {self.op} {self.b}"

    @property
    def answer(self) -> int:
        return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]

    @property
    def key(self) -> str:
        """The canonical form: a + b and b + a (a * b and b * a) are one problem."""
        a, b = sorted((self.a, self.b)) if self.op in "+*" else (self.a, self.b)
        return f"{a} {self.op} {b}"

    @property
    def split(self) -> Split:
        """Fixed by the problem itself, so the splits never share a problem whatever is drawn."""
        fraction = int.from_bytes(hashlib.sha256(self.key.encode()).digest()[:8], "big") / 2**64
        return "heldout" if fraction < HELDOUT_SHARE else "train"

    def row(self) -> dict[str, str]:
        """A dataset row: the prompt and the answer as text (a JSONL column the reward functions receive)."""
        return {"prompt": PROMPT.format(question=self.question), "answer": str(self.answer)}


TASKS = (*LEVELS, calc_steps.NAME)
"""Every task of the `task`, `demo --task` and `compare --task` commands: the levels (one reply each), calc-steps."""


def level(name: str) -> Level:
    require(name in LEVELS, f"unknown task level {name!r}; choose from {', '.join(LEVELS)}")
    return LEVELS[name]


def check_task(name: str) -> str:
    """`name` when it is one of TASKS, else a UsageError listing them."""
    require(name in TASKS, f"unknown task level {name!r}; choose from {', '.join(TASKS)}")
    return name


def task_tools(name: str) -> list[Callable]:
    """The tools a task's episodes may call; none for a level, whose problems are answered in one reply."""
    return list(calc_steps.TOOLS) if check_task(name) == calc_steps.NAME else []


def split_problems(name: str, split: Split) -> list[Problem]:
    """Every problem of the level in the split, in a fixed order."""
    require(split in ("train", "heldout"), f"split must be train or heldout, got {split!r}")
    spec = level(name)
    return [p for p in (Problem(a, spec.op, b) for a, b in spec.operand_pairs()) if p.split == split]


def problems(name: str, split: Split, n: int | None = None, seed: int = 0) -> list[dict[str, str]]:
    """n rows ({"prompt", "answer"}) of the task's split, without repeats, in an order fixed by `seed`; n None: all
    (calc-steps: its `POOL`)."""
    if check_task(name) == calc_steps.NAME:
        return calc_steps.problems(split, n, seed)
    pool = split_problems(name, split)
    require(n is None or 0 < n <= len(pool), f"{name} has {len(pool)} {split} problems; asked for {n}")
    random.Random(f"{name}/{split}/{seed}").shuffle(pool)
    return [p.row() for p in pool[:n]]


# ---------------------------------------------------------------- rewards (TRL's reward-function convention)

ANSWER_LINE = re.compile(r"Answer:\s*(-?\d+)")
INTEGER = re.compile(r"-?\d+")
FINAL_LINE = re.compile(r"Answer: -?\d+\.?")


def reply_text(completion: Any) -> str:
    """A completion as text: a string, or TRL's conversational form (a list of messages, the reply last)."""
    if isinstance(completion, list):
        return str(completion[-1]["content"]) if completion else ""
    return str(completion)


def extracted_answer(completion: Any) -> int | None:
    """The reply's answer: the integer of its last "Answer:" line, else its last integer, else None."""
    text = reply_text(completion).replace(",", "")  # "1,024" is 1024
    found = ANSWER_LINE.findall(text) or INTEGER.findall(text)
    return int(found[-1]) if found else None


def exact_match(prompts: list, completions: list, completion_ids: list, answer: list, **columns: Any) -> list[float]:
    """1.0 where the reply's answer (`extracted_answer`) equals the row's `answer` exactly, else 0.0."""
    return [float(extracted_answer(c) == int(a)) for c, a in zip(completions, answer)]


def answer_format(prompts: list, completions: list, completion_ids: list, **columns: Any) -> list[float]:
    """1.0 where the reply's last non-empty line is "Answer: <integer>" (the asked-for format), else 0.0."""
    last_lines = [(reply_text(c).strip().splitlines() or [""])[-1].strip() for c in completions]
    return [float(FINAL_LINE.fullmatch(line) is not None) for line in last_lines]


# ---------------------------------------------------------------- command line


def write_task(name: str, out: str | Path, n_train: int | None = None, n_heldout: int | None = None,
               seed: int = 0, overwrite: bool = False) -> tuple[Path, Path]:
    """Write OUT/train.jsonl and OUT/heldout.jsonl ({"prompt", "answer"} per line); refuses to replace them unless
    `overwrite`. Returns the two paths."""
    out = Path(out)
    require(not out.exists() or out.is_dir(), f"--out {out} is a file, not a folder")
    paths = out / "train.jsonl", out / "heldout.jsonl"
    existing = [str(p) for p in paths if p.exists()]
    require(overwrite or not existing, f"{', '.join(existing)} exists; pass --overwrite to replace it")
    rows = problems(name, "train", n_train, seed), problems(name, "heldout", n_heldout, seed)
    for path, split_rows in zip(paths, rows):
        atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in split_rows))
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("list", help="the tasks, a sample problem of each, and how many problems each split has")
    write = actions.add_parser("write", help="write a task's train.jsonl and heldout.jsonl")
    write.add_argument("level", help=f"the task: {', '.join(TASKS)}")
    write.add_argument("--out", required=True, help="folder for train.jsonl and heldout.jsonl")
    write.add_argument("--train", type=NON_NEGATIVE_INT, default=0,
                       help=f"training problems (0 = all of them; calc-steps: {calc_steps.POOL['train']})")
    write.add_argument("--heldout", type=NON_NEGATIVE_INT, default=0, help="held-out problems (0 = all of them; "
                       f"calc-steps: {calc_steps.POOL['heldout']})")
    write.add_argument("--seed", type=SEED, default=0, help="seed of the order the problems are drawn in")
    write.add_argument("--overwrite", action="store_true", help="replace existing train.jsonl / heldout.jsonl")
    evaluate = actions.add_parser("evaluate", help="a run's start policy and checkpoints on held-out problems: "
                                  "exact-match accuracy and its change, with 95%% prompt-level bootstrap intervals")
    evaluate.add_argument("runs", nargs="+", metavar="RUN_DIR",
                          help="run directories from one start policy (e.g. ppo, rloo, grpo), trained on this level")
    evaluate.add_argument("--level", required=True, help=f"the task: {', '.join(TASKS)} (calc-steps: multi-turn "
                          "episodes with its calculator tool)")
    evaluate.add_argument("--out", required=True, help="folder for task_eval.json (every reply and the summary)")
    evaluate.add_argument("--heldout", type=NON_NEGATIVE_INT, default=200,
                          help=f"held-out problems (0 = all of them; calc-steps: {calc_steps.POOL['heldout']})")
    evaluate.add_argument("--replies-per-prompt", type=POSITIVE_INT, default=1, help="replies sampled per problem")
    evaluate.add_argument("--checkpoints", default="all", help='"all", "latest" or iterations like 10,20')
    evaluate.add_argument("--batch-size", type=POSITIVE_INT, default=32, help="replies generated at once")
    evaluate.add_argument("--seed", type=SEED, default=1234, help="sampling seed, the same for every model")
    evaluate.add_argument("--device", default="auto", help='"auto", "cpu", "cuda" or "cuda:N"')


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
        return 0
    if args.action == "evaluate":
        return evaluate_command(args)
    train, heldout = write_task(args.level, args.out, args.train or None, args.heldout or None, args.seed,
                                args.overwrite)
    print(f"wrote {train} and {heldout}")
    return 0


def evaluate_command(args: argparse.Namespace) -> int:
    from ppo_rlhf.tasks.evaluate import evaluate_task_runs  # lazy: torch loads after the arguments are checked

    check_task(args.level)
    out = Path(args.out)
    require(not out.exists() or out.is_dir(), f"--out {out} is a file, not a folder")
    result = evaluate_task_runs(args.runs, args.level, args.heldout or None, args.replies_per_prompt, args.checkpoints,
                               args.seed, args.batch_size, args.device)
    atomic_write_text(out / "task_eval.json", json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    for s in result["summary"]:
        acc, change = s["accuracy"], s["accuracy_change"]
        print(f"{s['model']:24s} exact match {acc['mean']:6.1%} [{acc['lo']:.1%}, {acc['hi']:.1%}]  change "
              f"{change['mean']:+.1%} [{change['lo']:+.1%}, {change['hi']:+.1%}]  KL {s['kl']:.2f}  "
              f"format {s['formatted']:.0%}  finished {s['finished']:.0%}  {s['tokens']:.1f} tokens")
    print(f"wrote {out / 'task_eval.json'}")
    return 0

