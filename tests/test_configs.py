"""The shipped config files are valid: every key known, every value in range; each field type accepts and refuses
what it should."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from ppo_rlhf.config import Bounds, build_config, check_value, field_types, read_yaml, to_yaml
from ppo_rlhf.errors import UsageError
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.study.demo import DemoConfig
from ppo_rlhf.utils.device import DTYPE_NAMES

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


@pytest.mark.parametrize("cls", [TrainConfig, DemoConfig], ids=lambda c: c.__name__)
def test_every_default_satisfies_its_own_field_type(cls):
    kinds = field_types(cls)
    assert set(kinds) == {field.name for field in dataclasses.fields(cls)}
    for field in dataclasses.fields(cls):
        if field.default == "":  # a required field: validate() names it when it is missing
            continue
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default  # (lists)
        assert check_value(field.name, default, kinds[field.name]) == default, field.name


def test_choice_fields_match_the_modules_that_implement_them():
    from ppo_rlhf.models.generation import BACKENDS
    from ppo_rlhf.ppo.objectives import ESTIMATORS
    from ppo_rlhf.ppo.schedules import SCHEDULES

    kinds = field_types(TrainConfig)
    assert kinds["dtype"].choices == DTYPE_NAMES
    assert kinds["advantage_estimator"].choices == ESTIMATORS
    assert kinds["generation_backend"].choices == BACKENDS
    assert kinds["lr_schedule"].choices == SCHEDULES


@pytest.mark.parametrize("field, value, expected", [
    ("policy_lr", "1e-5", 1e-5),  # YAML reads 1e-5 as a string
    ("iterations", "1e3", 1000), ("iterations", 12.0, 12), ("iterations", " 7 ", 7),
    ("eos_rule", False, False), ("ptx_data", None, None), ("dtype", "bfloat16", "bfloat16"), ("beta", 0, 0.0),
])
def test_values_each_field_type_accepts(field, value, expected):
    assert check_value(field, value, field_types(TrainConfig)[field]) == expected


@pytest.mark.parametrize("field, value, message", [
    ("eos_rule", None, "eos_rule: expected true or false, got null"), ("eos_rule", "true", "true or false"),
    ("eos_rule", 1, "true or false"), ("batch_size", True, "an integer > 0"), ("batch_size", 2.5, "an integer > 0"),
    ("batch_size", 10**400, "an integer > 0"), ("beta", "nan", "a number >= 0"), ("beta", -0.1, "a number >= 0"),
    ("clip_range", 1.0, "in (0, 1)"), ("seed", -1, "in [0, 4294967295]"), ("out", 2024, "quote it"),
    ("out", " ", "a non-empty string"), ("ptx_data", "", "a non-empty string"),
    ("dtype", "fp8", "one of auto, float32"),
    ("prompts", ["a.jsonl"], "a non-empty string"),
])
def test_values_each_field_type_refuses(field, value, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        check_value(field, value, field_types(TrainConfig)[field])


@pytest.mark.parametrize("betas", ["0.05,-1", "0.05,nan", "0,0", "a"])
def test_demo_betas_are_distinct_non_negative_numbers(betas):
    with pytest.raises(UsageError, match="betas"):
        build_config(DemoConfig, {"betas": betas})


def test_every_number_field_declares_its_interval():
    """So that the reliability fuzz generates out-of-range values for a new field too (an unbounded number must be
    said to be one, here)."""
    any_finite_number = {"unfinished_score", "reward_weights"}  # (a negative weight: a penalty)
    for cls in (TrainConfig, DemoConfig):
        for name, kind in field_types(cls).items():
            if kind.kind in (int, float) and name not in any_finite_number:
                assert kind.bounds != Bounds(), f"{cls.__name__}.{name}: give its type an interval (PositiveInt, ...)"


def test_every_dtype_flag_offers_the_same_names():
    """The trainer, the demo and the prompts and pairs commands share one list of dtype names (one place to add one)."""
    import argparse

    from ppo_rlhf.models.precision import resolve_dtype
    from ppo_rlhf.study import pairs, prompts

    assert field_types(DemoConfig)["dtype"].choices == DTYPE_NAMES
    for module in (prompts, pairs):
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        dtype_flag = next(action for action in parser._actions if action.dest == "dtype")
        assert tuple(dtype_flag.choices) == DTYPE_NAMES, module.__name__
    for name in DTYPE_NAMES:  # and precision.py turns every one of them into a torch dtype
        assert isinstance(resolve_dtype(name, torch.device("cpu")), torch.dtype), name


def test_a_key_given_twice_in_a_yaml_file_is_refused_with_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("# a comment\nbeta: 0.05\nreward_model: rm\nbeta: 0.5\n")
    with pytest.raises(UsageError, match=re.escape(f"{path}: key 'beta' is given twice (lines 2 and 4); keep one")):
        read_yaml(path)
    path.write_text("beta: 0.05\nreward_model: rm\n")  # each key once: read as before
    assert read_yaml(path) == {"beta": 0.05, "reward_model": "rm"}


def test_a_failed_relation_check_says_which_values_came_from_the_file(tmp_path):
    import argparse

    from ppo_rlhf.config import config_from_args

    path = tmp_path / "x.yaml"
    path.write_text("reward_model: rm\nprompts: p.jsonl\nminibatch_size: 8\nbatch_size: 4\n")

    def refusal(**flags) -> str:
        with pytest.raises(UsageError) as caught:
            config_from_args(TrainConfig, argparse.Namespace(config=str(path), **flags))
        return str(caught.value)

    assert refusal() == f"minibatch_size (8, from {path}) must not exceed batch_size (4, from {path})"
    assert refusal(batch_size=4) == f"minibatch_size (8, from {path}) must not exceed --batch-size (4)"  # a flag
    assert refusal(minibatch_size=3, batch_size=7) == "--batch-size (7) must be a multiple of --minibatch-size (3)"


def test_a_failed_relation_check_names_the_settings_as_the_user_wrote_them(tmp_path):
    """The API names fields, the command line flags; a value the user never set is called the default."""
    import argparse

    from ppo_rlhf.config import config_from_args

    def refusal(build) -> str:
        with pytest.raises(UsageError) as caught:
            build()
        return str(caught.value)

    assert refusal(lambda: TrainConfig(batch_size=4)) == (
        "minibatch_size (16, the default) must not exceed batch_size (4)")
    assert refusal(lambda: config_from_args(TrainConfig, argparse.Namespace(batch_size=4))) == (
        "--minibatch-size (16, the default) must not exceed --batch-size (4)")
    assert refusal(lambda: config_from_args(TrainConfig, argparse.Namespace(batch_size=4, minibatch_size=16))) == (
        "--minibatch-size (16) must not exceed --batch-size (4)")  # given, though equal to the default
    assert refusal(lambda: TrainConfig(critic_warmup_iterations=3, iterations=2)) == (
        "critic_warmup_iterations (3) must be less than iterations (2): the policy trains only in the iterations "
        "after the critic warm-up")
    assert refusal(lambda: TrainConfig(iterations=3, critic_warmup_iterations=1, warmup_iterations=3)) == (
        "warmup_iterations (3) must not exceed the policy's iterations, iterations (3) - critic_warmup_iterations "
        "(1) = 2")


def test_a_missing_demo_output_says_what_writes_it(tmp_path, monkeypatch, capsys):
    """configs/smollm2_offline.yaml reads runs/demo/reward_model: after `make demo-quick` only runs/demo-quick has
    one."""
    from ppo_rlhf.cli import main

    monkeypatch.chdir(tmp_path)
    shipped = str(Path(__file__).parent.parent / "configs" / "smollm2_offline.yaml")
    assert main(["train", "--config", shipped]) == 2
    assert capsys.readouterr().err == (
        "ppo-rlhf train: error: reward_model: model folder runs/demo/reward_model not found; `make demo` writes it, "
        "or use --reward-model runs/demo-quick/reward_model (written by `make demo-quick`)\n")
    (tmp_path / "runs/demo-quick/reward_model").mkdir(parents=True)
    (tmp_path / "runs/demo-quick/reward_model/config.json").write_text("{}")
    assert main(["train", "--config", shipped, "--reward-model", "runs/demo-quick/reward_model"]) == 2
    assert capsys.readouterr().err == (
        "ppo-rlhf train: error: prompts file runs/demo/prompts/ppo.jsonl not found; `make demo` writes it, or use "
        "--prompts runs/demo-quick/prompts/ppo.jsonl (written by `make demo-quick`)\n")
    cfg = build_config(TrainConfig, {"reward_model": "runs/demo/reward_model", "prompts": "p.jsonl"})
    with pytest.raises(UsageError, match=re.escape("or use --reward-model runs/demo-quick/reward_model") + "$"):
        cfg.check_files()  # the quick demo's copy exists: no "written by"
    cfg = build_config(TrainConfig, {"reward_model": "./models/rm", "prompts": "p.jsonl"})
    with pytest.raises(UsageError, match=r"model folder ./models/rm not found$"):  # not a demo's folder: no hint
        cfg.check_files()


def test_the_merged_copy_never_records_log_pi_old():
    """Sampling from the merged copy with old_logprobs: generation would make log pi_old the copy's numbers, a
    mismatch that mismatch_kl (the record against itself) cannot show: refused in one line."""
    from ppo_rlhf import PPOConfig, UsageError

    with pytest.raises(UsageError, match="old_logprobs: recompute"):
        PPOConfig(generation_merged_copy=True, old_logprobs="generation")
    assert PPOConfig(generation_merged_copy=True).old_logprobs == "recompute"


@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_whiten_rewards_is_refused_where_no_estimator_would_read_it(estimator):
    # rloo and grpo take each reply's total reward; the whitened per-token rewards are GAE's alone
    with pytest.raises(UsageError, match="whiten_rewards whitens the per-token rewards GAE reads"):
        build_config(TrainConfig, {"advantage_estimator": estimator, "group_size": 2, "whiten_rewards": True})
    assert build_config(TrainConfig, {"advantage_estimator": "ev-gated", "group_size": 2, "whiten_rewards": True})
