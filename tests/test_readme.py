"""The README a newcomer reads first: short, without the project's issue numbers, and its example the script the
tests run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_at_most_250_lines_and_names_no_issue():
    assert len(README.splitlines()) <= 250
    assert not re.search(r"\bissues? \d+", README, flags=re.IGNORECASE), re.findall(r".{30}issues? \d+.{10}", README)


def test_the_readmes_example_is_examples_own_reward():
    """Every line of code in the README's first Python block appears in examples/own_reward.py (the example the
    tests run), after the keyword arguments written inline there are spread."""
    block = re.search(r"```python\n(.*?)```", README, flags=re.DOTALL)
    assert block is not None
    script = (ROOT / "examples" / "own_reward.py").read_text()
    for name in ("correct", "brief"):
        assert f"def {name}(" in block.group(1) and f"def {name}(" in script
    for setting in ('"iterations": 20', '"max_new_tokens": 32', '"reward_weights": [1.0, 0.5]',
                    '"critic_warmup_iterations": 3'):
        inline = setting.replace('"', "").replace(": ", "=")
        assert setting in script and inline in block.group(1), setting


def test_the_readmes_command_line_run_names_the_same_settings():
    """"The same run from the command line" sets what the Python example sets."""
    line = README[README.index("The same run from the command line"):]
    line = line[:line.index("(the CLI builds")]
    for flag in ("--reward-weights 1 0.5", "--critic-warmup-iterations 3", "--max-new-tokens 32",
                 "--out runs/own_reward", "my_rewards.py:correct", "my_rewards.py:brief"):
        assert flag in " ".join(line.split()), flag
