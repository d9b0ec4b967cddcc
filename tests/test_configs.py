"""The shipped config files are valid: every key known, every value in range."""

from pathlib import Path

import pytest

from ppo_rlhf.config import build_config, read_yaml, to_yaml
from ppo_rlhf.train_config import TrainConfig

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_train_configs_are_valid(path):
    cfg = build_config(TrainConfig, read_yaml(path))
    assert cfg.adam_eps == 1e-5 and cfg.max_grad_norm == 1.0 and cfg.gamma == 1.0 and cfg.lam == 0.95


def test_saved_yaml_round_trips_with_field_docs():
    cfg = build_config(TrainConfig, {"reward_model": "rm", "prompts": "p.jsonl", "beta": 0.0, "policy_lr": "3e-5"})
    text = to_yaml(cfg)
    assert "# Per-token KL penalty coefficient" in text
    import yaml

    assert build_config(TrainConfig, yaml.safe_load(text)) == cfg
