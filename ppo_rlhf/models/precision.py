"""Numeric precision of a run, in one place: which dtype the frozen weights are stored (and multiplied) in.

* "float32": every weight in fp32, the chapter's run (the bit-exact tests pin it).
* "bfloat16" / "float16": the frozen base weights are stored in the half type, so their memory halves and every
  large matmul (body, LM head, generation) runs in it. Kept in fp32: what is trained (LoRA factors, the value
  model's score head copy, hence their gradients and optimiser states), every LoRA factor and every score head
  (tiny, and a reward's rounding would move the normalised score). A LoRA factor multiplies in the half dtype
  (`half_lora_products`: the fp32 factor is cast, not the activations); a score head reads its input as fp32 (the
  hook below). Log-softmax, log-probs, KL, GAE, losses and whitening are fp32 wherever they are computed
  (`.float()` on every logit and value).
* "auto" (the default): bfloat16 where the hardware multiplies it natively (a CUDA GPU with bf16, a CPU with
  AVX512-BF16 or AMX-BF16), float32 elsewhere.

No autocast: weights stored in bf16 are already what the matmuls read, and autocast during `generate` was measured
slower than bf16 weights (5.4 s vs 4.0 s for 8 x 48 tokens, bench/HISTORY.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from ppo_rlhf.errors import require
from ppo_rlhf.utils.device import DTYPE_NAMES

_CPU_BF16_FLAGS = {"avx512_bf16": "AVX512-BF16", "amx_bf16": "AMX-BF16"}  # /proc/cpuinfo flag -> its name
_warned: set[str] = set()  # warnings already given by this process


def _cpu_flags(cpuinfo: str | None) -> set[str] | None:
    """/proc/cpuinfo's flags (or those of the given text); None where there is no such file (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[-1].split())
    return flags


def cpu_bf16_extensions(cpuinfo: str | None = None) -> list[str]:
    """The bf16 dot-product extensions of this CPU ("AVX512-BF16", "AMX-BF16"), from /proc/cpuinfo's flags; [] when
    there are none or it cannot tell (the safe choice). torch.backends.cpu.get_cpu_capability() says only "AVX512",
    not whether the BF16 extension is there."""
    flags = _cpu_flags(cpuinfo) or set()
    return [name for flag, name in _CPU_BF16_FLAGS.items() if flag in flags]


def cpu_matrix_flags(cpuinfo: str | None = None) -> str:
    """The CPU's instruction sets that decide bf16 and fp32 matmul speed, by their /proc/cpuinfo names ("amx_bf16
    avx512_bf16 avx512f avx2"): what a benchmark writes next to its numbers, since the machines differ."""
    flags = _cpu_flags(cpuinfo)
    if flags is None:
        return "unknown"
    sets = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")
    return " ".join(f for f in sets if f in flags) or f"none of {'/'.join(sets)}"


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU has bf16 dot-product instructions (AVX512-BF16 or AMX-BF16)."""
    return bool(cpu_bf16_extensions(cpuinfo))


def dtype_name(dtype: torch.dtype) -> str:
    """The setting's spelling of a torch dtype: torch.bfloat16 -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The storage dtype of frozen weights for a `dtype` setting on this device."""
    require(name in DTYPE_NAMES, f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {name!r}")
    if name != "auto":
        if name == "bfloat16" and device.type == "cpu" and not cpu_has_native_bf16() and name not in _warned:
            _warned.add(name)
            print("warning: dtype bfloat16 on a CPU without AVX512-BF16/AMX-BF16: its matmuls run emulated, usually "
                  "slower than float32 (dtype auto picks float32 on this CPU)", file=sys.stderr)
        return getattr(torch, name)
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported()
    else:
        native = device.type == "cpu" and cpu_has_native_bf16()
    return torch.bfloat16 if native else torch.float32


def describe_dtype(name: str, device: torch.device) -> str:
    """How a `dtype` setting resolves on this device and why, for the run's first line and run_info.json: "auto ->
    float32 (no AVX512-BF16/AMX-BF16 on this CPU)", "auto -> bfloat16 (AMX-BF16)", or the setting itself."""
    resolved = dtype_name(resolve_dtype(name, device))
    if name != "auto":
        return resolved
    if device.type == "cuda":
        why = "this GPU supports bf16" if resolved == "bfloat16" else "no bf16 on this GPU"
    elif device.type != "cpu":
        why = f"no native bf16 known on {device.type}"
    elif resolved == "bfloat16":
        why = "/".join(cpu_bf16_extensions()) or "native bf16 on this CPU"
    else:
        why = "no AVX512-BF16/AMX-BF16 on this CPU"
    return f"auto -> {resolved} ({why})"


def _keeps_fp32(name: str, param: nn.Parameter) -> bool:
    return param.requires_grad or "lora_" in name or ".score." in f".{name}"


def _input_to_weight_dtype(module: nn.Module, args: tuple) -> tuple:
    dtype = next(module.parameters()).dtype
    return tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


def store_frozen_weights(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast a loaded model's frozen base weights to `dtype` (in place), keeping trained parameters, LoRA factors and
    score heads in fp32 (by name, so before or after LoRA is added; models._finish calls it before, and PEFT keeps
    the factors it adds fp32: autocast_adapter_dtype). float32 changes nothing."""
    if dtype == torch.float32:
        return model
    for name, param in model.named_parameters():  # a tied weight (embeddings = LM head) is one parameter, cast once
        if not _keeps_fp32(name, param) and param.dtype != dtype:
            param.data = param.data.to(dtype)
    for name, module in model.named_modules():
        # An fp32 score head (or PEFT's wrapper around the frozen head and its trained copy) reads half hidden states
        if name.split(".")[-1] == "score":
            module.register_forward_pre_hook(_input_to_weight_dtype)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        # generate's first step slices the last position (hidden[:, -1:]) before the LM head; on a CPU a strided
        # half input makes torch copy the [V, D] head once per row (3.8 s instead of 0.013 s for 64 rows of SmolLM2,
        # bench/HISTORY.md, "A strided slice before the LM head")
        head.register_forward_pre_hook(_contiguous_input)
    return model


def _contiguous_input(module: nn.Module, args: tuple) -> tuple:
    return (args[0].contiguous(), *args[1:])


class HalfMatmulLinear(nn.Linear):
    """A LoRA factor stored in fp32 (the copy AdamW updates) that multiplies in its input's half dtype, like autocast:
    each call casts the small [r, d] factor, where PEFT would cast the [b, l, d] activations to fp32 and autograd
    their gradients back (bench/HISTORY.md, "LoRA products in bf16"). The factor's gradient arrives in fp32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return nn.functional.linear(x, self.weight.to(x.dtype), bias)


def half_lora_products(model: nn.Module, enabled: bool = True) -> nn.Module:
    """LoRA's products in the half dtype of the layers they adapt (in place; `enabled=False` undoes it). Layers over
    fp32 weights are left as PEFT made them, so float32 runs are unchanged."""
    for module in model.modules():
        if not hasattr(module, "cast_input_dtype_enabled"):  # PEFT's LoraLayer
            continue
        factors = [f for d in (module.lora_A, module.lora_B) for f in d.values() if isinstance(f, nn.Linear)]
        half = enabled and module.get_base_layer().weight.dtype in (torch.bfloat16, torch.float16) and bool(factors)
        module.cast_input_dtype_enabled = not half
        for factor in factors:
            factor.__class__ = HalfMatmulLinear if half else nn.Linear
    return model


def weight_dtypes(model: nn.Module) -> dict[torch.dtype, int]:
    """Parameter count per dtype (for logs and tests)."""
    counts: dict[torch.dtype, int] = {}
    for param in model.parameters():
        counts[param.dtype] = counts.get(param.dtype, 0) + param.numel()
    return counts
