"""TRL 1.12's PPOConfig settings as ours (ppo_rlhf/ppo/from_trl.py): the bench's TRL side, converted, is the bench's own
side; each field without an equivalent is one UsageError line. TRL is not installed here: its config is a dict or a
plain object with its attributes."""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from ppo_rlhf import PPOConfig
from ppo_rlhf.errors import UsageError
from ppo_rlhf.ppo.from_trl import STOP_TOKEN_NOTE, TRL_DEFAULTS, settings_from_trl

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("peer_trl", ROOT / "bench" / "peer_trl.py")
peer_trl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer_trl)

# TRL's PPOConfig carries no models, prompts, adapters or our speed settings: the bench passes those to each side
OURS_ONLY = ("policy_model", "reward_model", "prompts", "out", "lora_rank", "lora_alpha", "old_logprobs", "tensorboard",
             "quiet", "logprob_chunk_mb", "init_score_head", "padding_free", "generation_drop_finished")


def bench_args(**overrides) -> argparse.Namespace:
    values = dict(model_path="/models/smollm2", batch=32, minibatch=16, micro_batch=0, epochs=2, max_new_tokens=48,
                  temperature=0.7, warmup=1, iterations=2, seed=1, old_logprobs="generation", dtype="bfloat16",
                  trl_mode="bf16", logprob_chunk_mb=128.0, device="cpu", padding_free=False, keep_finished=False)
    return argparse.Namespace(**values | overrides)


@pytest.mark.parametrize("overrides", [{}, {"micro_batch": 8}, {"batch": 16, "minibatch": 4, "epochs": 4},
                                       {"trl_mode": "fp32", "dtype": "float32", "max_new_tokens": 64, "seed": 3}])
def test_the_bench_trl_configuration_converts_to_the_bench_settings_of_ours(tmp_path, overrides):
    args = bench_args(**overrides)
    ours = peer_trl.ours_settings(args, tmp_path)
    converted = PPOConfig.from_trl(peer_trl.trl_settings(args, str(tmp_path / "trl")),
                                   **{key: ours[key] for key in OURS_ONLY})
    assert {key: getattr(converted, key) for key in ours} == ours
    # what the bench leaves to the defaults on our side, TRL's side sets the same way
    assert (converted.kl_placement, converted.kl_kind, converted.eos_rule, converted.unfinished_score) == \
        ("reward", "k1", True, -1.0)
    assert converted.trackers == [] and converted.generation_batch_size == 0 and converted.advantage_estimator == "gae"


def test_a_config_object_is_read_by_attribute(tmp_path):
    trl = SimpleNamespace(**TRL_DEFAULTS | dict(
        stop_token="eos", total_episodes=1000, per_device_train_batch_size=4, gradient_accumulation_steps=8,
        num_mini_batches=4, kl_estimator="k3", num_ppo_epochs=1, missing_eos_penalty=2.0, whiten_rewards=True,
        lr_scheduler_type="cosine", warmup_steps=0.1, report_to=["wandb"], push_to_hub=True, hub_model_id="me/policy",
        output_dir=str(tmp_path / "run"), save_steps=5, local_rollout_forward_batch_size=16, fp16=True))
    config = PPOConfig.from_trl(trl)
    assert config == PPOConfig(**settings_from_trl(trl))  # the settings the module converts, as a config
    assert (config.batch_size, config.minibatch_size, config.micro_batch_size) == (32, 8, 4)
    assert config.iterations == math.ceil(1000 / 32)  # TRL's num_total_batches
    assert (config.score_batch_size, config.generation_batch_size) == (16, 16)
    assert (config.kl_kind, config.epochs, config.unfinished_score, config.whiten_rewards) == ("k3", 1, -2.0, True)
    assert (config.lr_schedule, config.warmup_iterations) == ("cosine", math.ceil(0.1 * 32))
    assert (config.report_to, config.push_to_hub, config.out, config.checkpoint_every) == \
        (["wandb"], "me/policy", str(tmp_path / "run"), 5)
    assert (config.policy_lr, config.value_lr, config.adam_eps, config.dtype) == (3e-6, 3e-6, 1e-8, "float16")
    assert config.sample_every == 32 // 10
    # TRL's defaults: bf16 unless fp16; no EOS rule without missing_eos_penalty; our own fields win
    config = PPOConfig.from_trl({"stop_token": "eos", "total_episodes": 64}, num_processes=2, policy_model="smollm2",
                                iterations=3)
    assert (config.dtype, config.eos_rule, config.batch_size, config.iterations) == ("bfloat16", False, 16, 3)
    assert (config.lr_schedule, config.epochs, config.beta, config.max_new_tokens) == ("linear", 4, 0.05, 53)


def test_enums_of_training_arguments_are_read_by_value():
    from transformers.trainer_utils import IntervalStrategy, SchedulerType
    from transformers.training_args import OptimizerNames

    trl = SimpleNamespace(**TRL_DEFAULTS | dict(stop_token="eos", total_episodes=64, save_strategy=IntervalStrategy.NO,
                                                lr_scheduler_type=SchedulerType.COSINE,
                                                optim=OptimizerNames.ADAMW_TORCH_FUSED))
    config = PPOConfig.from_trl(trl)
    assert (config.lr_schedule, config.checkpoint_every) == ("cosine", config.iterations)
    with pytest.raises(UsageError, match="TRL's lr_scheduler_type='polynomial'"):
        PPOConfig.from_trl(SimpleNamespace(**vars(trl) | {"lr_scheduler_type": SchedulerType.POLYNOMIAL}))


@pytest.mark.parametrize("field, value, says", [
    ("stop_token", "</s>", "replies always end at the tokenizer's EOS"),
    ("stop_token_id", 7, "replies always end at the tokenizer's EOS"),
    ("kl_estimator", "k2", "TRL allows k1 or k3"),
    ("ref_adapter_name", "ref", "the reference is that adapter switched off"),
    ("ds3_gather_for_generation", False, "there is no ZeRO-3"),
    ("weight_decay", 0.01, "AdamW runs without weight decay"),
    ("adam_beta2", 0.95, "AdamW uses torch's default beta2"),
    ("optim", "adafactor", "the optimiser is torch's AdamW"),
    ("lr_scheduler_type", "polynomial", "lr_schedule is one of"),
    ("deepspeed", "ds.json", "accelerate launch"),
    ("save_strategy", "epoch", "checkpoint_every"),
    ("report_to", ["mlflow"], "trackers are tensorboard, wandb, trackio"),
    ("push_to_hub", True, "set hub_model_id"),
    ("total_episodes", None, "set total_episodes or pass iterations="),
])
def test_a_field_without_an_equivalent_is_one_line_saying_why(field, value, says):
    settings = {"stop_token": "eos", "total_episodes": 64, field: value}
    with pytest.raises(UsageError) as error:
        PPOConfig.from_trl(settings)
    text = str(error.value)
    assert len(text.splitlines()) == 1 and text.startswith(f"TRL's {field}=") and says in text


def test_typos_and_bad_batches_are_one_line():
    with pytest.raises(UsageError, match="'kl_coeff' is not a field of TRL 1.12's PPOConfig"):
        PPOConfig.from_trl({"stop_token": "eos", "total_episodes": 64, "kl_coeff": 0.1})
    with pytest.raises(UsageError, match=r"TRL's batch \(8\) must be a multiple of num_mini_batches \(3\)"):
        PPOConfig.from_trl({"stop_token": "eos", "total_episodes": 64, "num_mini_batches": 3})
    with pytest.raises(UsageError, match="clip_range"):  # our own checks still apply to converted values
        PPOConfig.from_trl({"stop_token": "eos", "total_episodes": 64, "cliprange": 1.5})
    # TrainingArguments fields that do not change PPO's computation pass (logging, data loading)
    config = PPOConfig.from_trl({"stop_token": "eos", "total_episodes": 64, "logging_steps": 1,
                                 "dataloader_num_workers": 2, "vf_coef": 1.0, "max_grad_norm": 0.5})
    assert config.max_grad_norm == 1.0  # TRL 1.12's PPO loop never clips gradients: ours keeps its own clip


def test_trl_default_stop_token_converts_with_a_one_line_note():
    """TRL's stop_token defaults to None: a dict without it converts, and the one difference is said once."""
    with pytest.warns(UserWarning) as caught:
        config = PPOConfig.from_trl({"total_episodes": 64, "learning_rate": 1e-5})
    assert [str(w.message) for w in caught] == [STOP_TOKEN_NOTE] and len(STOP_TOKEN_NOTE.splitlines()) == 1
    assert "stop_token=None" in STOP_TOKEN_NOTE and "EOS" in STOP_TOKEN_NOTE
    assert config.policy_lr == 1e-5 and config.max_new_tokens == 53


def test_trl_names_given_to_the_config_get_ours_and_from_trl():
    with pytest.raises(UsageError) as caught:
        PPOConfig(output_dir="runs/x", learning_rate=1e-5)
    text = str(caught.value)
    assert len(text.splitlines()) == 1
    assert "out (for output_dir)" in text and "policy_lr and value_lr (for learning_rate)" in text
    assert "PPOConfig.from_trl({'output_dir': ..., 'learning_rate': ...})" in text
    with pytest.raises(UsageError, match=r"nothing for weight_decay \(TRL's weight_decay=0.1 has no equivalent"):
        PPOConfig(weight_decay=0.1)
    with pytest.raises(UsageError, match=r"^PPOConfig has no field 'bata'; did you mean 'beta'\?$"):
        PPOConfig(bata=0.1)
