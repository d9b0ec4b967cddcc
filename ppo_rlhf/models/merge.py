"""The LoRA merge: the policy's weights with its adapter added in (W + B A * alpha / r), under plain Hugging Face
names, computed on the side so that the policy itself is never changed. One arithmetic for every user, so that they
hold the same numbers: an exported merged model (`export.save_policy(merge=True)`), the merged copy the HF backend
samples from (`generation_merged_copy`) and the weights written to a vLLM engine.

The arithmetic: the product B A * alpha / r is added to W in fp32 and the sum rounded once to W's dtype. Adding in
W's own dtype would round the product first and the sum after it (two roundings, in bf16 each up to half a unit in
the last place); merging in place and back (`merge_adapter`/`unmerge_adapter`) would leave rounding error in the
policy's base weights, which are also the reference model.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ppo_rlhf.errors import require

PEFT_PREFIX = "base_model.model."


def plain_name(name: str) -> str:
    """A PEFT state-dict name under its plain Hugging Face name: `base_model.model.model.layers.0.self_attn.q_proj.
    base_layer.weight` -> `model.layers.0.self_attn.q_proj.weight`."""
    name = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
    return name.replace(".base_layer.", ".")


@torch.no_grad()
def merged_state_dict(policy: nn.Module) -> dict[str, torch.Tensor]:
    """The policy's weights with its LoRA adapter merged (fp32 add, one rounding to each weight's dtype), under plain
    Hugging Face names, without changing the policy. A model without PEFT is returned as is (cloned)."""
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer

    if not isinstance(policy, PeftModel):
        return {name: tensor.detach().clone() for name, tensor in policy.state_dict().items()}
    weights = {plain_name(name): tensor.detach().clone() for name, tensor in policy.state_dict().items()
               if "lora_" not in name and "modules_to_save" not in name}
    for name, module in policy.named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            key = plain_name(name + ".weight")
            summed = weights[key].to(torch.float32)
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    summed = summed + module.get_delta_weight(adapter).to(torch.float32)
            weights[key] = summed.to(weights[key].dtype)
    return weights


@torch.no_grad()
def merged_copy(policy: nn.Module, into: nn.Module | None = None) -> nn.Module:
    """A plain transformers model (no peft) computing the LoRA policy's function with its adapter merged into the
    weights (`merged_state_dict`); `into`, an earlier copy, is refreshed in place instead of building a new one. Eval
    mode, no gradients; the policy is untouched. Each weight keeps the dtype it has in the policy."""
    require(hasattr(policy, "get_base_model"),
            f"merging needs a LoRA policy (a PeftModel), got {type(policy).__name__}")
    if into is None:
        # a copy of the loaded model, not one built from its config: on SmolLM2 in bf16 a copy built with
        # `from_config` decoded 2x slower with the same weights, dtypes and config (bench/HISTORY.md 2026-12-07)
        # (`unload`: the adapter's layers removed, nothing merged; the merged values come from one place, above)
        into = copy.deepcopy(policy).unload().eval().requires_grad_(False)
    into.load_state_dict(merged_state_dict(policy))
    return into
