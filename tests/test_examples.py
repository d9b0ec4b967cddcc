"""The scripts in examples/ run as written, on tiny models (their `main(**settings)` takes the sizes)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_settings(tiny_model_dirs, out: Path) -> dict:
    return dict(policy_model=str(tiny_model_dirs["policy"]), out=str(out), iterations=2, batch_size=4,
                minibatch_size=2, epochs=1, max_new_tokens=6, reward_norm_samples=4, lora_rank=4, report_to=[],
                quiet=True, dtype="float32", device="cpu", critic_warmup_iterations=1)


def history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "history.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", ["own_reward", "verifiable_task", "from_trl", "multi_turn"])
def test_examples_are_short(name):
    assert len((EXAMPLES / f"{name}.py").read_text().splitlines()) <= 50


def test_own_reward_example(tiny_model_dirs, tmp_path):
    folder = example("own_reward").main(**tiny_settings(tiny_model_dirs, tmp_path / "run"))
    assert (Path(folder) / "adapter_config.json").is_file() and (Path(folder) / "README.md").is_file()
    rows = history(tmp_path / "run")
    assert len(rows) == 2 and all({"reward/correct", "reward/brief"} <= set(row) for row in rows)


def test_verifiable_task_example(tiny_model_dirs, tmp_path, capsys):
    before, after = example("verifiable_task").main(heldout=4, **tiny_settings(tiny_model_dirs, tmp_path / "run"))
    assert 0 <= before <= 1 and 0 <= after <= 1
    assert "held-out exact match on 4 add-tiny problems" in capsys.readouterr().out
    rows = history(tmp_path / "run")
    assert len(rows) == 2 and all({"reward/exact_match", "reward/answer_format"} <= set(row) for row in rows)


def test_multi_turn_example(tiny_model_dirs, tmp_path, capsys):
    settings = tiny_settings(tiny_model_dirs, tmp_path / "run") | {"max_turns": 2, "max_episode_tokens": 30}
    (before, before_tools), (after, after_tools) = example("multi_turn").main(heldout_problems=4, **settings)
    assert all(0 <= share <= 1 for share in (before, before_tools, after, after_tools))
    assert "held-out calc-steps exact match" in capsys.readouterr().out
    rows = history(tmp_path / "run")
    assert len(rows) == 2 and all(1 <= row["turns"] <= 2 and "tool_calls" in row for row in rows)
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["tools"] == ["ppo_rlhf.tasks.calc_steps:calc"] and saved["max_turns"] == 2


def test_from_trl_example(tiny_model_dirs, tmp_path):
    module = example("from_trl")
    run_dir = module.main(**tiny_settings(tiny_model_dirs, tmp_path / "run"))
    saved = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    # TRL's settings arrived (those the tiny run does not override)
    trl = module.TRL_SETTINGS
    assert (saved["policy_lr"], saved["value_lr"], saved["beta"], saved["temperature"]) == \
        (trl["learning_rate"], trl["learning_rate"], trl["kl_coef"], trl["temperature"])
    assert (saved["eos_rule"], saved["unfinished_score"], saved["kl_estimator"], saved["seed"]) == \
        (True, -trl["missing_eos_penalty"], trl["kl_estimator"], trl["seed"])
    assert len(history(run_dir)) == 2 and "reward/exact_match" in history(run_dir)[0]
