import sys
from pathlib import Path

import pytest

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
