import sys
from pathlib import Path

import pytest
import torch

# Tiny models gain nothing from a second thread, and on a shared 2-core machine threads fight each other.
torch.set_num_threads(1)

sys.path.insert(0, str(Path(__file__).parent))

import tiny  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    return tiny.tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory, tokenizer):
    """A tiny policy folder and a tiny reward-model folder, saved like hub downloads."""
    root = tmp_path_factory.mktemp("tiny_models")
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, root / "policy")
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, root / "reward")
    return {"policy": policy, "reward": reward}


def pytest_terminal_summary(terminalreporter):
    """Survival counts of tests/test_reliability.py (a module-level RELIABILITY_SURVIVAL dict), shown even with -q."""
    for name, module in list(sys.modules.items()):
        counts = getattr(module, "RELIABILITY_SURVIVAL", None) if name.endswith("test_reliability") else None
        if isinstance(counts, dict) and any(tried for tried, _ in counts.values()):
            parts = [f"{name}: {survived}/{tried} survived" for name, (tried, survived) in counts.items()]
            terminalreporter.write_line("reliability: " + ", ".join(parts))
