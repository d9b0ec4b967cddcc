"""Coming from TRL: TRL 1.12's PPO settings (`trl.experimental.ppo.PPOConfig`) as the settings of a `PPOConfig` of
ours, which `PPOConfig.from_trl` builds (this module does not import the config: it only names its fields).

    from ppo_rlhf import PPOConfig
    config = PPOConfig.from_trl(trl_config, policy_model="smollm2", out="runs/mine")   # or a dict of TRL's fields

A TRL field either maps to one of ours (the table in docs/from-trl.md), needs nothing (TRL computes it, or it only
shapes logging or memory), or has no equivalent: then, unless it holds the value that behaves like ours, the
conversion stops with one UsageError line naming the field and why. A dict may hold any subset of TRL's fields (the
rest take TRL 1.12's defaults); a config object is read by attribute (TRL need not be installed). Keyword arguments
set our own fields (models, prompts, rewards, out) and win over converted ones.

Batch sizes assume one process unless `num_processes` says how many TRL ran on: TRL's batch is
per_device_train_batch_size x gradient_accumulation_steps per process; ours, batch_size, counts every process's.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from enum import Enum
from typing import Any

from ppo_rlhf.errors import UsageError, require

# TRL 1.12's defaults for every field read here: trl/experimental/ppo/ppo_config.py, its base trl/trainer/base_config.py
# (learning_rate 3e-6, bf16 None = True unless fp16) and transformers' TrainingArguments.
TRL_DEFAULTS: dict[str, Any] = {
    # PPOConfig's own fields
    "num_mini_batches": 1, "total_episodes": None, "local_rollout_forward_batch_size": 64,
    "num_sample_generations": 10, "response_length": 53, "stop_token": None, "stop_token_id": None,
    "temperature": 0.7, "missing_eos_penalty": None, "sft_model_path": "EleutherAI/pythia-160m",
    "reward_model_path": "EleutherAI/pythia-160m", "model_adapter_name": None, "ref_adapter_name": None,
    "num_ppo_epochs": 4, "whiten_rewards": False, "kl_coef": 0.05, "kl_estimator": "k1", "cliprange": 0.2,
    "vf_coef": 0.1, "cliprange_value": 0.2, "gamma": 1.0, "lam": 0.95, "ds3_gather_for_generation": True,
    "dataset_num_proc": None,
    # computed by TRL's trainer from the others (read back from a config a trainer has used: ignored)
    "world_size": None, "num_total_batches": None, "micro_batch_size": None, "local_batch_size": None,
    "batch_size": None, "local_mini_batch_size": None, "mini_batch_size": None,
    # TrainingArguments fields that change what PPO computes
    "learning_rate": 3e-6, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
    "num_train_epochs": 3.0, "seed": 42, "adam_epsilon": 1e-8, "adam_beta1": 0.9, "adam_beta2": 0.999,
    "weight_decay": 0.0, "optim": "adamw_torch", "max_grad_norm": 1.0, "lr_scheduler_type": "linear",
    "lr_scheduler_kwargs": None, "warmup_steps": 0, "warmup_ratio": 0.0, "bf16": None, "fp16": False,
    "use_cpu": False, "output_dir": None, "report_to": "none", "push_to_hub": False, "hub_model_id": None,
    "save_strategy": "steps", "save_steps": 500, "gradient_checkpointing": True, "deepspeed": None, "fsdp": "",
}

STOP_TOKEN_NOTE = ("TRL's stop_token=None (its default) samples every reply to response_length; ppo-rlhf stops a reply "
                   "at the tokenizer's EOS, as TRL does with stop_token='eos'")

SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
ADAMW = ("adamw_torch", "adamw_torch_fused")
TRACKERS = ("tensorboard", "wandb", "trackio")


def trl_values(config_or_dict: Any) -> dict[str, Any]:
    """TRL's settings as a dict over TRL_DEFAULTS' keys: a dict's keys (checked against TRL's fields) over the
    defaults, or a config object's attributes."""
    if isinstance(config_or_dict, Mapping):
        unknown = [key for key in config_or_dict if key not in TRL_DEFAULTS]
        if unknown:
            from transformers import TrainingArguments  # lazy: only to tell TRL's other fields from typos

            known = set(TrainingArguments.__dataclass_fields__) | {"run_name"}
            typos = [key for key in unknown if key not in known]
            if typos:
                raise UsageError(f"{typos[0]!r} is not a field of TRL 1.12's PPOConfig")
        values = {**TRL_DEFAULTS, **{k: v for k, v in config_or_dict.items() if k in TRL_DEFAULTS}}
    else:
        values = {key: getattr(config_or_dict, key, default) for key, default in TRL_DEFAULTS.items()}
    # TrainingArguments turns some strings into enums (SchedulerType.LINEAR, IntervalStrategy.NO): their values
    return {key: value.value if isinstance(value, Enum) else value for key, value in values.items()}


def our_names_for(trl_settings: Mapping[str, Any]) -> str:
    """What each of TRL's settings given to `PPOConfig(...)` is called here, found by converting it (so the names
    come from `settings_from_trl`, the one mapping): "out (for output_dir), policy_lr and value_lr (for
    learning_rate)". A setting converted to nothing says so; one refused says why."""
    names = []
    probe = {"stop_token": "eos", "total_episodes": 64}  # (a conversion needs these)
    before = settings_from_trl(probe, iterations=10)
    for trl_name, value in trl_settings.items():
        try:
            after = settings_from_trl(probe | {trl_name: value}, iterations=10)
        except UsageError as error:
            names.append(f"nothing for {trl_name} ({error})")
            continue
        ours = [name for name in after if after[name] != before.get(name)]
        names.append(f"{' and '.join(ours)} (for {trl_name})" if ours else f"nothing for {trl_name} (not needed)")
    return ", ".join(names)


def refuse_unless(ok: bool, field: str, value: Any, why: str) -> None:
    if not ok:
        raise UsageError(f"TRL's {field}={value!r} has no equivalent in ppo-rlhf: {why}")


def check_no_equivalent(t: dict[str, Any]) -> None:
    """The fields ppo-rlhf cannot honour, each accepted only at the value that behaves like ppo-rlhf."""
    refuse_unless(t["stop_token"] in ("eos", None) and t["stop_token_id"] is None,
                  "stop_token" if t["stop_token"] not in ("eos", None) else "stop_token_id",
                  t["stop_token"] if t["stop_token"] not in ("eos", None) else t["stop_token_id"],
                  "replies always end at the tokenizer's EOS; set stop_token='eos' (and no stop_token_id)")
    refuse_unless(t["kl_estimator"] in ("k1", "k3"), "kl_estimator", t["kl_estimator"], "TRL allows k1 or k3")
    for name in ("model_adapter_name", "ref_adapter_name"):
        refuse_unless(t[name] is None, name, t[name], "the policy has one LoRA adapter; the reference is that "
                      "adapter switched off")
    refuse_unless(t["ds3_gather_for_generation"], "ds3_gather_for_generation", False,
                  "there is no ZeRO-3 (ZeRO 1/2 and FSDP generate with gathered weights)")
    refuse_unless(t["weight_decay"] == 0, "weight_decay", t["weight_decay"], "AdamW runs without weight decay")
    for name, default in (("adam_beta1", 0.9), ("adam_beta2", 0.999)):
        refuse_unless(t[name] == default, name, t[name], f"AdamW uses torch's default {name[-5:]} ({default})")
    refuse_unless(t["optim"] in ADAMW, "optim", t["optim"],
                  "the optimiser is torch's AdamW")
    refuse_unless(t["lr_scheduler_type"] in SCHEDULES, "lr_scheduler_type",
                  t["lr_scheduler_type"], f"lr_schedule is one of {', '.join(SCHEDULES)} (with warm-up)")
    refuse_unless(not t["lr_scheduler_kwargs"], "lr_scheduler_kwargs", t["lr_scheduler_kwargs"],
                  "the schedules take no parameters")
    refuse_unless(not (t["deepspeed"] or t["fsdp"]), "deepspeed" if t["deepspeed"] else "fsdp",
                  t["deepspeed"] or t["fsdp"], "launch with `accelerate launch --config_file "
                  "configs/accelerate/<fsdp|deepspeed_zero2>.yaml -m ppo_rlhf train` instead")
    refuse_unless(t["save_strategy"] in ("steps", "no"), "save_strategy", t["save_strategy"],
                  "checkpoints are every checkpoint_every iterations")
    refuse_unless(not t["push_to_hub"] or bool(t["hub_model_id"]), "push_to_hub", True,
                  "push_to_hub takes a repository id; set hub_model_id")


def report_to(value: Any) -> list[str]:
    names = [value] if isinstance(value, str) else list(value or [])
    if names in (["none"], []):
        return []
    if names == ["all"]:
        return ["all"]
    other = [name for name in names if name not in TRACKERS]
    refuse_unless(not other, "report_to", other[0] if other else None, f"trackers are {', '.join(TRACKERS)}")
    return names


def batch_settings(t: dict[str, Any], num_processes: int) -> dict[str, Any]:
    """Our batch sizes from TRL's: its local batch is per_device_train_batch_size x gradient_accumulation_steps."""
    local_batch = t["per_device_train_batch_size"] * t["gradient_accumulation_steps"]
    batch = local_batch * num_processes
    require(t["num_mini_batches"] >= 1 and local_batch % t["num_mini_batches"] == 0,
            f"TRL's batch ({local_batch}) must be a multiple of num_mini_batches ({t['num_mini_batches']})")
    local_minibatch = local_batch // t["num_mini_batches"]
    micro = t["per_device_train_batch_size"]
    forward = t["local_rollout_forward_batch_size"]
    return {"batch_size": batch, "minibatch_size": batch // t["num_mini_batches"],
            "micro_batch_size": micro if micro < local_minibatch else 0,  # 0: the whole minibatch in one pass
            "score_batch_size": forward, "generation_batch_size": forward if forward < local_batch else 0}


def settings_from_trl(config_or_dict: Any, num_processes: int = 1, **ours: Any) -> dict[str, Any]:
    """The `PPOConfig` fields for the settings of TRL 1.12's `PPOConfig` (an object with its attributes, or a dict of
    some of its fields); `ours` sets ppo-rlhf fields directly (policy_model, prompts, reward_funcs, out, ...). A TRL
    field with no equivalent raises UsageError with one line saying why. See docs/from-trl.md."""
    require(isinstance(num_processes, int) and num_processes >= 1, f"num_processes must be >= 1, got {num_processes}")
    t = trl_values(config_or_dict)
    check_no_equivalent(t)
    if t["stop_token"] is None:  # TRL's default: converted, as the one difference a user of it should know
        warnings.warn(STOP_TOKEN_NOTE, stacklevel=3)
    settings = batch_settings(t, num_processes)
    if "iterations" in ours:
        iterations = ours["iterations"]
    else:
        refuse_unless(t["total_episodes"] is not None, "total_episodes", None, "without it TRL counts epochs over "
                      "the dataset, which ppo-rlhf does not see here; set total_episodes or pass iterations=")
        iterations = math.ceil(t["total_episodes"] / settings["batch_size"])  # TRL's num_total_batches
    warmup = t["warmup_ratio"] or (t["warmup_steps"] if 0 < t["warmup_steps"] < 1 else 0)  # a ratio of the run
    samples = t["num_sample_generations"]
    save_steps = t["save_steps"] if t["save_steps"] >= 1 else math.ceil(t["save_steps"] * iterations)
    settings |= {
        "iterations": iterations,
        "epochs": t["num_ppo_epochs"],
        "temperature": t["temperature"],
        "top_p": 1.0,  # TRL samples with top_k 0, top_p 1
        "max_new_tokens": t["response_length"],
        # TRL subtracts the penalty from the raw score of a reply without EOS; ours replaces the normalised score
        "eos_rule": t["missing_eos_penalty"] is not None,
        "unfinished_score": -float(t["missing_eos_penalty"] or 1.0),
        "beta": t["kl_coef"],
        "kl_in": "reward",  # TRL puts -kl_coef * KL_t into every token's reward
        "kl_estimator": t["kl_estimator"],
        "whiten_rewards": t["whiten_rewards"],
        "gamma": t["gamma"],
        "lam": t["lam"],
        "clip_range": t["cliprange"],
        "value_clip_range": t["cliprange_value"],
        "advantage_estimator": "gae",
        # one AdamW over policy and value in TRL: the same learning rate for both of ours
        "policy_lr": t["learning_rate"],
        "value_lr": t["learning_rate"],
        "adam_eps": t["adam_epsilon"],
        "lr_schedule": SCHEDULES[t["lr_scheduler_type"]],
        "warmup_iterations": math.ceil(warmup * iterations) if warmup else int(t["warmup_steps"]),
        "seed": t["seed"],
        "dtype": "float16" if t["fp16"] else "bfloat16" if t["bf16"] is not False else "float32",
        "device": "cpu" if t["use_cpu"] else "auto",
        "report_to": report_to(t["report_to"]),
        "push_to_hub": t["hub_model_id"] if t["push_to_hub"] else None,
        "checkpoint_every": iterations if t["save_strategy"] == "no" else int(save_steps),
        "sample_every": max(1, iterations // samples) if samples > 0 else iterations,
    }
    if t["output_dir"]:
        settings["out"] = str(t["output_dir"])
    return settings | ours
