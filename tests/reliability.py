"""What the reliability tests share: the tiny settings, the survival counts (printed at the end of the session by
tests/conftest.py), and the check that a command refuses bad input in one line.

The reliability tests: bad input (tests/test_bad_inputs.py: hypothesis-generated malformed configs, flags and JSONL
files, bad model folders and run directories, fed to `ppo_rlhf.cli.main` in-process: exit code 2, one stderr line,
no traceback); numerical faults (tests/ppo/test_faults.py: NaN rewards, inf gradients, NaN losses are skipped and
logged, the weights do not move, too many in a row stop the run with its last checkpoint intact); kills
(tests/ppo/test_kills.py: `kill -9` of a training subprocess, then `--resume`: `latest` always names a complete
checkpoint and the final history equals an uninterrupted run's); safety (tests/models/test_safety.py: torch.load
only with weights_only=True, trust_remote_code never on by default).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from hypothesis import HealthCheck, settings

from ppo_rlhf.cli import main

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["Tell me a story", "Hello! How are you?", "What is the source of energy?", "Once upon a time",
           "I love this day", "The quick brown fox", "This is terrible", "A cat in a house"]
TIME_KEYS = ("time_gen", "time_score", "time_update", "time_total", "gen_tokens_per_s")

# name -> [tried, survived]; printed by the pytest_terminal_summary hook of conftest.py
RELIABILITY_SURVIVAL: dict[str, list[int]] = {"bad inputs": [0, 0], "bad config values": [0, 0],
                                              "bad CLI arguments": [0, 0],
                                              "numerical faults": [0, 0], "kills": [0, 0]}

HYPOTHESIS = settings(max_examples=40, deadline=None, derandomize=True,
                      suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@contextlib.contextmanager
def survival(kind: str):
    """Count one try of `kind`; it survived if the block finished without an assertion failing."""
    RELIABILITY_SURVIVAL[kind][0] += 1
    yield
    RELIABILITY_SURVIVAL[kind][1] += 1


def small(env, out, **overrides) -> dict:
    values = dict(policy_model=env["policy"], reward_model=env["reward"], prompts=env["prompts"], out=str(out),
                  iterations=2, batch_size=4, minibatch_size=2, epochs=1, max_new_tokens=6, reward_norm_samples=8,
                  lora_rank=4, checkpoint_every=1, tensorboard=False, quiet=True, policy_lr=1e-3, value_lr=1e-3,
                  dtype="float32")
    values.update(overrides)
    return values


def flags(values: dict) -> list[str]:
    out = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            out.append(f"{flag}={value}")
    return out


def expect_usage_error(argv: list[str], *mentions: str, kind: str = "bad inputs") -> str:
    """main(argv) must return 2 with exactly one line on stderr naming one of `mentions`, and no traceback."""
    with survival(kind):
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)  # any exception other than a UsageError propagates and fails the test
        text = err.getvalue().strip()
        assert code == 2, (argv, code, text)
        assert len(text.splitlines()) == 1, text
        assert text.startswith("ppo-rlhf"), text
        assert "Traceback" not in text + out.getvalue()
        if mentions:
            assert any(m in text for m in mentions), (mentions, text)
    return text


def read_history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
