"""`key-door-H`: a delayed-credit probe in H turns, a multi-turn environment task (docs/multi-turn.md).

Turn 1: three keys lie on a table and a note, shown this once, names the key the door at the end opens with; the
policy takes one. Turns 2 to H-1: a corridor, one step a turn, each offering two ways (left, right or straight, drawn
from the instance, so the same instance always has the same corridor): any offered way is a valid move, and nothing
is rewarded. Turn H: the door; the policy says "open" and it opens only for the right key: reward 1, else 0. The
reward comes at the end only, and the choice it depends on was made H-1 turns before. A reply that is no valid move
(no offered key or way named, or two of them; no "open" at the door) ends the episode with reward 0.

The reward is the environment's (`KeyDoor.step`, whose exact check is `opens`); the run's reward function is
`horizon.environment_reward_only`, which adds nothing. The prompt is a chat whose first exchange is one worked game
(`DEMONSTRATION`: a 4-turn game played right), as calc-steps teaches its tool format: SmolLM2-135M-Instruct needs to
see the moves. An instance is (the three keys in their order, the right key); which split it belongs to is a hash of
it, the same at every horizon, so train and held-out instances are never the same. The environment keeps no state
but the row's and the episode's own, so a resumed run replays identically.

Torch-free.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from typing import Any

from ppo_rlhf.errors import UsageError, require

NAME = "key-door"
HORIZONS = (2, 4, 8, 16)
"""The horizons the task list names; any H from MIN_HORIZON to MAX_HORIZON is a task (`key-door-6`)."""
MIN_HORIZON, MAX_HORIZON = 2, 16
HELDOUT_SHARE = 0.3
COLOURS = ("red", "blue", "green", "yellow", "white", "black", "silver", "gold", "brown", "purple")
WAYS = ("left", "right", "straight")
INSTANCES = [(keys, right) for keys in itertools.permutations(COLOURS, 3) for right in keys]
"""Every instance: 720 ordered triples of keys, each with 3 right keys (2,160)."""

QUESTION = ('You stand in a hall. On a table lie three keys: a {0} key, a {1} key and a {2} key. A note says: "The '
            'door at the end of the corridor opens only with the {right} key." Which key do you take?')
WAY_QUESTION = "The corridor turns. Ways: {0} or {1}. Which way?"
DOOR_QUESTION = 'You reach the door. Say "open" to try your key.'
DEMONSTRATION = [{"role": "user", "content": QUESTION.format("green", "red", "white", right="red")},
                 {"role": "assistant", "content": "I take the red key."},
                 {"role": "user", "content": "You take the red key. " + WAY_QUESTION.format("left", "right")},
                 {"role": "assistant", "content": "left"},
                 {"role": "user", "content": "You go left. " + WAY_QUESTION.format("straight", "right")},
                 {"role": "assistant", "content": "straight"},
                 {"role": "user", "content": "You go straight. " + DOOR_QUESTION},
                 {"role": "assistant", "content": "open"}]
"""The worked game every prompt opens with: a 4-turn game played right (the key the note names, offered ways)."""
INVALID = "That is not a move here. The game ends."


def instance_key(keys: list[str] | tuple[str, ...], right: str) -> str:
    return f"{' '.join(keys)} / {right}"


def split_of(keys: list[str] | tuple[str, ...], right: str) -> str:
    """Fixed by the instance itself (not by the horizon), so no draw can cross the splits."""
    digest = hashlib.sha256(f"key-door {instance_key(keys, right)}".encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") / 2**64 < HELDOUT_SHARE else "train"


def prompt(keys: list[str] | tuple[str, ...], right: str) -> list[dict[str, str]]:
    """The chat of an instance: the demonstration, then the instance's first question."""
    return [*DEMONSTRATION, {"role": "user", "content": QUESTION.format(*keys, right=right)}]


def check_horizon(horizon: int) -> int:
    require(MIN_HORIZON <= horizon <= MAX_HORIZON,
            f"{NAME} horizons run from {MIN_HORIZON} to {MAX_HORIZON} turns, got {horizon}")
    return horizon


def problems(split: str, horizon: int, n: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """n distinct rows {"prompt", "keys", "right", "horizon"} of the split (None: every instance of it), in an order
    fixed by `seed` (a shorter draw is a prefix of a longer one)."""
    require(split in ("train", "heldout"), f"split must be train or heldout, got {split!r}")
    check_horizon(horizon)
    pool = [(keys, right) for keys, right in INSTANCES if split_of(keys, right) == split]
    require(n is None or 0 < n <= len(pool), f"{NAME} has {len(pool)} {split} instances; asked for {n}")
    random.Random(f"key-door/{split}/{seed}").shuffle(pool)
    return [{"prompt": prompt(keys, right), "keys": list(keys), "right": right, "horizon": horizon}
            for keys, right in pool[:n]]


def corridor(keys: list[str], right: str, horizon: int) -> list[tuple[str, str]]:
    """The two ways offered at each of the H-2 corridor steps, drawn from the instance (the same every episode)."""
    rng = random.Random(f"key-door corridor {instance_key(keys, right)}")
    return [tuple(rng.sample(WAYS, 2)) for _ in range(horizon - 2)]  # type: ignore[misc]


def named(text: str, words: list[str] | tuple[str, ...]) -> list[str]:
    """The words of `words` that `text` names (a word's start, any case: "goldkey" names gold), in `words`' order."""
    return [w for w in words if re.search(rf"\b{re.escape(w)}", text, re.IGNORECASE)]


def opens(key: str, right: str) -> bool:
    """The exact check: the door opens only for the right key."""
    return key == right


class KeyDoor:
    """One episode. `reset(**row)`, then `step(reply) -> (observation, reward or None, done)`; afterwards `success`
    (the door opened), `moves` and `valid_moves` (the episode's replies, and those that were valid moves)."""

    def reset(self, prompt: Any = None, keys: list[str] | None = None, right: str | None = None,
              horizon: int | None = None, **row: Any) -> None:
        if keys is None or right is None or horizon is None:
            raise UsageError("a key-door row needs keys, right and horizon columns (`ppo-rlhf task write key-door-H`)")
        self.keys, self.right, self.horizon = list(keys), str(right), check_horizon(int(horizon))
        self.ways = corridor(self.keys, self.right, self.horizon)
        self.key: str | None = None  # the key taken in turn 1
        self.turn, self.success, self.moves, self.valid_moves = 0, False, 0, 0
        return None  # the prompt already asks the first question

    def step(self, text: str) -> tuple[str, float | None, bool]:
        self.turn += 1
        self.moves += 1
        if self.turn == 1:
            chosen = named(text, self.keys)
            if len(chosen) != 1:
                return INVALID, 0.0, True
            self.key = chosen[0]
            return f"You take the {self.key} key. {self.next_question()}", None, False
        if self.turn < self.horizon:
            offered = self.ways[self.turn - 2]
            chosen = named(text, offered)
            if len(chosen) != 1:
                return INVALID, 0.0, True
            return f"You go {chosen[0]}. {self.next_question()}", None, False
        if not named(text, ("open",)):
            return INVALID, 0.0, True
        self.valid_moves += 1
        assert self.key is not None  # (the first turn set it or ended the episode)
        self.success = opens(self.key, self.right)
        return ("The door opens." if self.success else "The key does not fit."), float(self.success), True

    def next_question(self) -> str:
        """The question of the next turn; the move just made was valid."""
        self.valid_moves += 1
        if self.turn + 1 < self.horizon:
            return WAY_QUESTION.format(*self.ways[self.turn - 1])
        return DOOR_QUESTION


def environment() -> KeyDoor:
    """The environment factory (`environment: ppo_rlhf.tasks.key_door:environment`): a new episode's environment."""
    return KeyDoor()
