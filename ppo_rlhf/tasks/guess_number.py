"""`guess-T`: a stochastic search game of at most T turns, a multi-turn environment task (docs/multi-turn.md).

The environment picks a secret whole number from 1 to N (N = RANGE_PER_TURN x T) and the policy guesses,
one number a turn; after each wrong guess it hears "Higher." or "Lower." and how many tries are left. Reward 1 when
a guess is the secret (the episode ends), 0 when the T tries run out; a reply without a number is no valid move and
ends the episode with 0. The horizon grows through both T and N: binary search needs about log2(N) + 1 guesses, so
longer games leave more turns of slack but more numbers to rule out.

The secret is drawn per episode, at `reset`, from Python's `random` module: one prompt has easy and hard episodes, so
nothing but the feedback in the episode tells them apart. The trainer seeds that RNG from the run's seed and
checkpoints it, so a resumed run draws the same secrets; `ppo-rlhf task evaluate` seeds it with its sampling seed
before each model, so every model meets the same secrets on the same problems.

The game's only instance is its secret, and that is drawn per episode, so every row of a horizon is the same prompt:
the train and held-out files differ only in which episodes (secrets) they meet, all from one distribution, and the
held-out success is the success on fresh episodes, not on unseen problems. (Rows whose range started elsewhere than
1, LOW to LOW + N - 1 with LOW up to 200, would have made instances; SmolLM2-135M-Instruct ignored such ranges and
won 0 of 8 games at T = 4, docs/multi-turn.md.) The reward is the environment's (the exact check is `is_secret`); the
run's reward function is `horizon.environment_reward_only`, which adds nothing. The prompt opens with one worked game
(`DEMONSTRATION`: binary search from 1 to 8 in 3 tries), as calc-steps teaches its tool format.

Torch-free.
"""

from __future__ import annotations

import random
import re
from typing import Any

from ppo_rlhf.errors import UsageError, require

NAME = "guess"
HORIZONS = (2, 4, 8, 16)
"""The horizons the task list names; any T from MIN_HORIZON to MAX_HORIZON is a task (`guess-6`)."""
MIN_HORIZON, MAX_HORIZON = 2, 16
RANGE_PER_TURN = 4
"""N = 4 T numbers: a T-turn game's range (8 numbers in 2 tries ... 64 in 16)."""
POOL = {"train": 256, "heldout": 200}
"""Rows `problems(split)` gives when no count is given (what `ppo-rlhf task write guess-T` writes)."""

QUESTION = ("I picked a whole number from {low} to {high}. Guess it in at most {tries} tries. After each guess I say "
            "higher, lower or correct. Reply with one number.")
DEMONSTRATION = [{"role": "user", "content": QUESTION.format(low=1, high=8, tries=3)},
                 {"role": "assistant", "content": "4"},
                 {"role": "user", "content": "Higher. 2 tries left."},
                 {"role": "assistant", "content": "6"},
                 {"role": "user", "content": "Lower. 1 try left."},
                 {"role": "assistant", "content": "5"}]
"""The worked game every prompt opens with: binary search, from 1 to 8 in 3 tries (the secret 5)."""
INVALID = "That is not a number. The game ends."
NUMBER = re.compile(r"-?\d+")


def size(tries: int) -> int:
    return RANGE_PER_TURN * tries


def prompt(tries: int) -> list[dict[str, str]]:
    """The chat of a T-turn game: the demonstration, then the game's question."""
    return [*DEMONSTRATION, {"role": "user", "content": QUESTION.format(low=1, high=size(tries), tries=tries)}]


def check_horizon(horizon: int) -> int:
    require(MIN_HORIZON <= horizon <= MAX_HORIZON,
            f"{NAME} horizons run from {MIN_HORIZON} to {MAX_HORIZON} turns, got {horizon}")
    return horizon


def problems(split: str, horizon: int, n: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """n rows {"prompt", "low", "high", "tries"} of the split (None: POOL[split]), all the same game: the secret is
    drawn per episode (`seed` changes nothing; it is taken as every task's `problems` takes it)."""
    require(split in ("train", "heldout"), f"split must be train or heldout, got {split!r}")
    check_horizon(horizon)
    n = POOL[split] if n is None else n
    require(n > 0, f"n must be positive, got {n}")
    return [{"prompt": prompt(horizon), "low": 1, "high": size(horizon), "tries": horizon} for _ in range(n)]


def guessed(text: str) -> int | None:
    """The reply's guess: its first whole number, or None."""
    found = NUMBER.search(text.replace(",", ""))
    return int(found.group()) if found else None


def is_secret(guess: int, secret: int) -> bool:
    """The exact check."""
    return guess == secret


class GuessNumber:
    """One episode. `reset(**row)` draws the secret; then `step(reply) -> (observation, reward or None, done)`;
    afterwards `success`, `moves` and `valid_moves` (the episode's replies, and those with a number)."""

    def reset(self, prompt: Any = None, low: int | None = None, high: int | None = None, tries: int | None = None,
              **row: Any) -> None:
        if low is None or high is None or tries is None:
            raise UsageError("a guess row needs low, high and tries columns (`ppo-rlhf task write guess-T`)")
        self.low, self.high, self.tries = int(low), int(high), check_horizon(int(tries))
        require(self.low <= self.high, f"a guess row's low ({low}) is above its high ({high})")
        self.secret = random.randint(self.low, self.high)  # per episode, from the run's checkpointed RNG
        self.turn, self.success, self.moves, self.valid_moves = 0, False, 0, 0
        return None  # the prompt already asks the first question

    def step(self, text: str) -> tuple[str, float | None, bool]:
        self.turn += 1
        self.moves += 1
        guess = guessed(text)
        if guess is None:
            return INVALID, 0.0, True
        self.valid_moves += 1
        if is_secret(guess, self.secret):
            self.success = True
            return "Correct!", 1.0, True
        left = self.tries - self.turn
        if left == 0:
            return f"No tries left. It was {self.secret}.", 0.0, True
        direction = "Higher." if guess < self.secret else "Lower."
        return f"{direction} {left} {'try' if left == 1 else 'tries'} left.", None, False


def environment() -> GuessNumber:
    """The environment factory (`environment: ppo_rlhf.tasks.guess_number:environment`)."""
    return GuessNumber()
