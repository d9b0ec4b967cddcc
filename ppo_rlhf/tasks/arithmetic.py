"""Verifiable tasks generated offline: arithmetic problems whose reward is true by construction (the `ppo-rlhf task`
command: ppo_rlhf/tasks/command.py).

The multi-turn task `calc-steps` (ppo_rlhf.tasks.calc_steps: a * b + c with a calculator tool) goes through the same
commands and functions (`problems`, `write_task`, `check_task`, `task_tools`); its held-out evaluation runs episodes
with the tool. So do the environment tasks with a horizon knob, `key-door-H` and `guess-T` (ppo_rlhf.tasks.horizon,
`task_environment`), whose held-out evaluation runs episodes in their environment.

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

import hashlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ppo_rlhf.errors import require
from ppo_rlhf.tasks import calc_steps, horizon
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


TASKS = (*LEVELS, calc_steps.NAME, *horizon.listed_names())
"""The tasks of the `task`, `demo --task` and `compare --task` commands: the levels (one reply each), calc-steps, and
the environment tasks at their standard horizons (any horizon in a family's range is a task too: `horizon.parse`)."""


def level(name: str) -> Level:
    require(name in LEVELS, f"unknown task level {name!r}; choose from {', '.join(LEVELS)}")
    return LEVELS[name]


def check_task(name: str) -> str:
    """`name` when it is one of TASKS or an environment task at any horizon of its family, else a UsageError listing
    them."""
    require(name in TASKS or horizon.parse(name) is not None,
            f"unknown task level {name!r}; choose from {', '.join((*LEVELS, calc_steps.NAME))}, "
            f"{horizon.families_hint()}")
    return name


def task_tools(name: str) -> list[Callable]:
    """The tools a task's episodes may call; none for a level, whose problems are answered in one reply."""
    return list(calc_steps.TOOLS) if check_task(name) == calc_steps.NAME else []


def task_environment(name: str) -> Callable | None:
    """The environment factory of an environment task (`key-door-8`), else None."""
    return horizon.environment_factory(name) if horizon.parse(check_task(name)) is not None else None


def split_problems(name: str, split: Split) -> list[Problem]:
    """Every problem of the level in the split, in a fixed order."""
    require(split in ("train", "heldout"), f"split must be train or heldout, got {split!r}")
    spec = level(name)
    return [p for p in (Problem(a, spec.op, b) for a, b in spec.operand_pairs()) if p.split == split]


def problems(name: str, split: Split, n: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """n rows ({"prompt", "answer"}) of the task's split, without repeats, in an order fixed by `seed`; n None: all
    (calc-steps: its `POOL`, each prompt a chat; an environment task: its rows hold the environment's columns, no
    answer)."""
    if check_task(name) == calc_steps.NAME:
        return calc_steps.problems(split, n, seed)
    if horizon.parse(name) is not None:
        return horizon.problems(name, split, n, seed)
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


# ---------------------------------------------------------------- task files


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
