"""`calc-steps`: multi-step arithmetic with a calculator tool, a multi-turn task (docs/multi-turn.md).

A problem is `a * b + c` (a, b two-digit, c three-digit): SmolLM2-135M rarely gets the product right alone; with the
calculator, `<tool>calc(37 * 48 + 215)</tool>`, it only has to copy the result into its answer. SmolLM2's chat
template has no tool format, so the prompt teaches the plain one: a chat whose first exchange is a worked
demonstration (`DEMONSTRATION`: a question, the call, the tool's result, the answer), then the problem. Told in words
alone (one user message), SmolLM2-135M-Instruct called the tool in 0 of 32 training problems; with the demonstration
in 29 (docs/multi-turn.md). Which split a problem belongs to is a hash of the problem (as in `arithmetic`), so train
and held-out instances are never the same. The checker is `arithmetic.exact_match` on the last turn's text (the reward
functions of a multi-turn run see the final turn as the completion).

    from ppo_rlhf.tasks.calc_steps import calc, problems
    from ppo_rlhf.tasks.arithmetic import exact_match
    PPOTrainer(config, reward_funcs=[exact_match], train_dataset=problems("train", 512), tools=[calc])

Torch-free.
"""

from __future__ import annotations

import ast
import hashlib
import operator
import random
from typing import Any

from ppo_rlhf.errors import require

NAME = "calc-steps"
HELDOUT_SHARE = 0.3
"""Share of the problems held out (by the hash of the problem, not by drawing)."""
POOL = {"train": 2000, "heldout": 500}
"""Problems `problems(split)` draws when no count is given (what `ppo-rlhf task write calc-steps` writes): the family
has millions, so "all of them" means these; a shorter draw with the same seed is their prefix."""
QUESTION = "What is {question}? Use the calculator."
DEMONSTRATION = [{"role": "user", "content": QUESTION.format(question="12 * 34 + 567")},
                 {"role": "assistant", "content": "<tool>calc(12 * 34 + 567)</tool>"},
                 {"role": "tool", "content": "975"},
                 {"role": "assistant", "content": "Answer: 975"}]
"""The worked exchange every prompt opens with (the plain tool format, then the asked-for "Answer: N" line)."""
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calc(expression: str) -> str:
    """The calculator tool: an integer expression of + - * and parentheses, evaluated exactly ("error: ..." for any
    other text, which the policy sees as the observation)."""
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("only integers, + - * and parentheses")

    try:
        return str(value(ast.parse(str(expression).replace("x", "*"), mode="eval").body))
    except (SyntaxError, ValueError, RecursionError) as error:
        return f"error: {error}"


def question(a: int, b: int, c: int) -> str:
    return f"{a} * {b} + {c}"


def prompt(a: int, b: int, c: int) -> list[dict[str, str]]:
    """The chat of a problem: the demonstration, then the question."""
    return [*DEMONSTRATION, {"role": "user", "content": QUESTION.format(question=question(a, b, c))}]


def asked(prompt: list[dict[str, str]]) -> str:
    """The question a prompt asks (its last message), for reports."""
    return prompt[-1]["content"]


def split_of(a: int, b: int, c: int) -> str:
    """Fixed by the problem itself (a * b and b * a are one problem), so no draw can cross the splits."""
    low, high = sorted((a, b))
    key = question(low, high, c)
    fraction = int.from_bytes(hashlib.sha256(f"calc-steps {key}".encode()).digest()[:8], "big") / 2**64
    return "heldout" if fraction < HELDOUT_SHARE else "train"


def problems(split: str, n: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """n distinct rows {"prompt": a chat (`prompt`), "answer"} of the split (None: POOL[split]), drawn in an order
    fixed by `seed`."""
    require(split in ("train", "heldout"), f"split must be train or heldout, got {split!r}")
    n = POOL[split] if n is None else n
    require(n > 0, f"n must be positive, got {n}")
    rng, seen = random.Random(f"calc-steps/{split}/{seed}"), set()
    rows: list[dict[str, Any]] = []
    while len(rows) < n:
        a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(100, 999)
        if split_of(a, b, c) != split or (min(a, b), max(a, b), c) in seen:
            continue
        seen.add((min(a, b), max(a, b), c))
        rows.append({"prompt": prompt(a, b, c), "answer": str(a * b + c)})
    return rows


TOOLS = [calc]
"""The tools an episode of this task may call (training and `ppo-rlhf task evaluate`)."""
