"""`ppo-rlhf memory`: what the four models of RLHF cost in memory (section 8.7), and the setups people actually run.

Weights and optimiser state, per parameter:
* mixed precision (the chapter's count): trained 16 bytes = 2 bf16 weights + 2 bf16 grads + 4 fp32 master copy
  + 4 + 4 for Adam's two moments; frozen 2 bytes (bf16 weights).
* fp32 everywhere (the chapter's own run): trained 16 bytes = 4 weights + 4 grads + 8 Adam; frozen 4 bytes.
GB are 1e9 bytes. Activations and the KV cache come on top; `activation_estimate` sizes the two biggest pieces.

Sizes come from `--params` (7B, 494M, 0.5e9) or from `--config` (a folder, a config.json, a Hugging Face id or the
alias smollm2): the model is then built on the meta device, which allocates no memory and needs no weights, and
counted. The LoRA, logits and KV-cache lines need widths and depth: with `--params` alone they use the Qwen2.5
shape nearest in size, and say so.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ppo_rlhf.config import POSITIVE_INT
from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.utils.paths import check_model_name

GB = 1e9
PRECISIONS = {  # name -> (bytes per trained parameter, bytes per frozen parameter)
    "mixed": (2 + 2 + 4 + 4 + 4, 2),
    "fp32": (4 + 4 + 8, 4),
}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SIZE_SUFFIXES = {"K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


@dataclass(frozen=True)
class ModelShape:
    name: str
    parameters: int  # the causal LM, tied embeddings counted once
    backbone_parameters: int  # without the LM head: what a reward or value model keeps
    hidden_size: int
    layers: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    lora_linears: tuple[tuple[int, int], ...]  # (in, out) features of every LoRA target layer


@dataclass(frozen=True)
class LlamaStyle:
    """The numbers of a Llama/Qwen2-style decoder's config.json: enough to count its parameters and LoRA factors."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool  # the LM head shares the embedding matrix
    qkv_bias: bool = True  # Qwen2 has biases on q, k and v

    def shape(self) -> ModelShape:
        head_dim = self.hidden // self.heads
        q, kv = self.heads * head_dim, self.kv_heads * head_dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden + (q + 2 * kv if self.qkv_bias else 0)
        block = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden  # + MLP + two RMSNorms
        backbone = self.vocab * self.hidden + self.layers * block + self.hidden  # embedding, blocks, final norm
        return ModelShape(
            name=self.name, parameters=backbone + (0 if self.tied else self.vocab * self.hidden),
            backbone_parameters=backbone, hidden_size=self.hidden, layers=self.layers, kv_heads=self.kv_heads,
            head_dim=head_dim, vocab_size=self.vocab,
            lora_linears=llama_style_linears(self.hidden, self.intermediate, self.heads, self.kv_heads, self.layers),
        )


def llama_style_linears(hidden: int, intermediate: int, heads: int, kv_heads: int, layers: int) -> tuple:
    """(in, out) of q, k, v, o, gate, up, down in every block of a Llama/Qwen2-style decoder."""
    head_dim = hidden // heads
    block = [(hidden, heads * head_dim), (hidden, kv_heads * head_dim), (hidden, kv_heads * head_dim),
             (heads * head_dim, hidden), (hidden, intermediate), (hidden, intermediate), (intermediate, hidden)]
    return tuple(block * layers)


# The chapter's model family, from each model's config.json. `--params N` alone borrows the shape nearest to N
# for the LoRA, logits and KV-cache lines: they depend on widths and depth, not on the count alone.
QWEN25 = (
    LlamaStyle("Qwen2.5-0.5B", hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151_936,
               tied=True),
    LlamaStyle("Qwen2.5-1.5B", hidden=1536, intermediate=8960, layers=28, heads=12, kv_heads=2, vocab=151_936,
               tied=True),
    LlamaStyle("Qwen2.5-3B", hidden=2048, intermediate=11008, layers=36, heads=16, kv_heads=2, vocab=151_936,
               tied=True),
    LlamaStyle("Qwen2.5-7B", hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, vocab=152_064,
               tied=False),
    LlamaStyle("Qwen2.5-14B", hidden=5120, intermediate=13824, layers=48, heads=40, kv_heads=8, vocab=152_064,
               tied=False),
    LlamaStyle("Qwen2.5-32B", hidden=5120, intermediate=27648, layers=64, heads=40, kv_heads=8, vocab=152_064,
               tied=False),
    LlamaStyle("Qwen2.5-72B", hidden=8192, intermediate=29568, layers=80, heads=64, kv_heads=8, vocab=152_064,
               tied=False),
)
# The chapter's model; its parameter count is exact (tied embeddings, so the backbone is the whole model).
QWEN25_05B = QWEN25[0].shape()
BOOK_ROWS = [("0.5B (our Qwen2.5-0.5B)", QWEN25_05B.parameters), ("7B", 7_000_000_000), ("70B", 70_000_000_000)]


def representative_shape(parameters: int) -> ModelShape:
    """The Qwen2.5 shape nearest to `parameters` (on a log scale), named so that the output says whose it is."""
    shapes = [family.shape() for family in QWEN25]
    nearest = min(shapes, key=lambda shape: abs(math.log(shape.parameters / parameters)))
    return replace(nearest, name=f"{nearest.name}, the Qwen2.5 shape nearest to {parameters:,} parameters")


def parse_parameter_count(text: str) -> int:
    """'7B', '494M', '0.5e9', '494032768' -> a positive integer count."""
    text = text.strip().replace("_", "").replace(",", "")
    multiplier = SIZE_SUFFIXES.get(text[-1:].upper(), 1)
    number = text[:-1] if multiplier != 1 else text
    try:
        value = float(number) * multiplier
    except ValueError:
        raise UsageError(f"--params must be a count like 7B, 494M or 0.5e9, got {text!r}") from None
    require(math.isfinite(value) and value >= 1, f"--params must be a positive count, got {text!r}")
    return round(value)


def lora_parameters(shape: ModelShape, rank: int) -> int:
    """LoRA adds A (rank x in) and B (out x rank) to each target layer: rank * (in + out) parameters."""
    return sum(rank * (fan_in + fan_out) for fan_in, fan_out in shape.lora_linears)


def four_models(parameters: int, precision: str = "mixed") -> dict[str, float]:
    """The chapter's table: full fine-tuning, policy and value trained, reference and reward frozen, all one size."""
    trained, frozen = PRECISIONS[precision]
    policy, frozen_model = trained * parameters / GB, frozen * parameters / GB
    total = 2 * policy + 2 * frozen_model
    return {"policy": policy, "value": policy, "reference": frozen_model, "reward": frozen_model, "total": total,
            "sft": policy, "ratio": total / policy}


def lora_setups(shape: ModelShape, rank: int, precision: str) -> dict[str, dict[str, float]]:
    """What the policy, value, reference and reward models hold in two LoRA setups (GB).

    The reference is the policy's frozen weights with the adapter switched off, so it costs nothing. A reward or
    value model is the backbone plus a one-number score head. In "shared backbone" the value model is the frozen
    reward backbone (counted once, under reward) with its own trained LoRA adapter and score head.
    """
    trained, frozen = PRECISIONS[precision]
    adapter, head = lora_parameters(shape, rank), shape.hidden_size
    lora_policy = (frozen * shape.parameters + trained * adapter) / GB
    reward = frozen * (shape.backbone_parameters + head) / GB
    full_value, shared_value = trained * (shape.backbone_parameters + head) / GB, trained * (adapter + head) / GB
    setups = {
        "LoRA policy, full value": {"policy": lora_policy, "value": full_value, "reference": 0.0, "reward": reward},
        "LoRA policy, LoRA value on the reward backbone": {"policy": lora_policy, "value": shared_value,
                                                           "reference": 0.0, "reward": reward},
    }
    for setup in setups.values():
        setup["total"] = sum(setup.values())
    return setups


def activation_estimate(shape: ModelShape, batch: int, seq_len: int, vocab: int) -> dict[str, float]:
    """The two biggest activation-side tensors (GB) for `batch` sequences of `seq_len` tokens.

    Logits are upcast to fp32 for the log-softmax, and autograd keeps both the logits and the log-softmax output for
    the backward pass: 2 x 4 bytes per (token, vocab entry). The KV cache of generation holds a key and a value per
    layer, KV head, head dimension and token.
    """
    kv_elements = 2 * shape.layers * shape.kv_heads * shape.head_dim * seq_len * batch
    logits_bytes = batch * seq_len * vocab * 4
    return {"logits_fp32": logits_bytes / GB, "logits_and_log_softmax_fp32": 2 * logits_bytes / GB,
            "kv_cache_bf16": kv_elements * 2 / GB, "kv_cache_fp32": kv_elements * 4 / GB}


def shape_from_config(source: str) -> ModelShape:
    """Count a model's parameters from its config alone, by building it on the meta device."""
    if source.endswith(".json"):
        require(Path(source).expanduser().is_file(), f"--config: no such file: {source}")
    else:  # what can be checked without torch is checked first: a typo costs no import
        try:
            check_model_name(source)
        except UsageError as error:
            raise UsageError(f"--config: {error}") from None
        require(not Path(source).expanduser().is_dir() or (Path(source).expanduser() / "config.json").is_file(),
                f"--config: {source} has no config.json (an adapter folder? give its base model)")
    # lazy: `ppo-rlhf memory` without --params/--config needs neither torch nor transformers
    import torch
    from torch import nn
    from transformers import AutoConfig, AutoModelForCausalLM

    from ppo_rlhf.models.loading import resolve_model_path

    if source.endswith(".json"):
        where = str(Path(source).expanduser())
    else:
        try:
            where = resolve_model_path(source)  # "smollm2", a .gguf file, a folder or a hub id, as `train` takes them
        except UsageError as error:
            raise UsageError(f"--config: {error}") from None
    try:
        config = AutoConfig.from_pretrained(where)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError) as error:
        raise UsageError(f"--config: cannot build a causal LM from {source!r}: {str(error).splitlines()[0]}") from None
    text = config.get_text_config()
    heads = text.num_attention_heads
    return ModelShape(
        name=source,
        parameters=sum(p.numel() for p in model.parameters()),
        backbone_parameters=sum(p.numel() for p in model.base_model.parameters()),
        hidden_size=text.hidden_size,
        layers=text.num_hidden_layers,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        vocab_size=text.vocab_size,
        lora_linears=tuple(
            (module.in_features, module.out_features)
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in LORA_TARGETS
        ),
    )


def build_report(rows: list[tuple[str, int]], shape: ModelShape | None, rank: int, batch: int, seq_len: int,
                 vocab: int | None) -> dict:
    report: dict = {
        "bytes_per_parameter": {name: {"trained": t, "frozen": f} for name, (t, f) in PRECISIONS.items()},
        "four_models": {p: [{"label": label, "parameters": n, **four_models(n, p)} for label, n in rows]
                        for p in PRECISIONS},
    }
    if shape is not None:
        require(bool(shape.lora_linears), f"{shape.name}: no {'/'.join(LORA_TARGETS)} layers to put LoRA on")
        report["shape"] = {k: v for k, v in asdict(shape).items() if k != "lora_linears"}
        report["lora"] = {"rank": rank, "targets": list(LORA_TARGETS), "trainable": lora_parameters(shape, rank),
                          "setups": {p: lora_setups(shape, rank, p) for p in PRECISIONS}}
        report["activations"] = {"batch": batch, "seq_len": seq_len, "vocab": vocab or shape.vocab_size,
                                 **activation_estimate(shape, batch, seq_len, vocab or shape.vocab_size)}
    return report


def _models_line(label: str, m: dict[str, float], width: int) -> str:
    return (f"  {label:<{width}}  policy {m['policy']:7.1f} GB  value {m['value']:7.1f} GB"
            f"  reference {m['reference']:6.1f} GB  reward {m['reward']:6.1f} GB  total {m['total']:7.1f} GB")


def format_report(report: dict) -> str:
    rows = report["four_models"]
    width = max(len(row["label"]) for rows_ in rows.values() for row in rows_)
    lines = ["== 3. memory for the four models (weights and optimizer state only; no activations, no KV cache)"]
    for row in rows["mixed"]:
        lines.append(_models_line(row["label"], row, width)
                     + f"  (SFT of the same model: {row['sft']:.1f} GB, so RLHF needs {row['ratio']:.2f}x)")
    lines += ["", "== fp32 everywhere (4 bytes weights, 4 grads, 8 Adam; frozen 4)"]
    lines += [_models_line(row["label"], row, width) for row in rows["fp32"]]
    if "lora" in report:
        shape, lora, act = report["shape"], report["lora"], report["activations"]
        lines += ["", f"== LoRA setups for {shape['name']} ({shape['parameters']:,} parameters)",
                  f"  LoRA rank {lora['rank']} on {','.join(t.removesuffix('_proj') for t in lora['targets'])}"
                  f" of {shape['layers']} blocks: {lora['trainable']:,} trainable parameters"
                  f" ({lora['trainable'] / shape['parameters']:.2%}); reference = adapter off, 0 GB extra"]
        setup_width = max(len(name) for name in lora["setups"]["mixed"])
        for precision, setups in lora["setups"].items():
            lines += [_models_line(f"{name} [{precision}]", setup, setup_width + 8) for name, setup in setups.items()]
        lines += ["", f"== activations: {act['batch']} sequences of {act['seq_len']} tokens, vocab {act['vocab']:,}",
                  f"  logits fp32 {act['logits_fp32']:.1f} GB; with the log-softmax kept for the backward"
                  f" {act['logits_and_log_softmax_fp32']:.1f} GB",
                  f"  KV cache ({shape['layers']} layers x {shape['kv_heads']} KV heads x {shape['head_dim']} dims x 2)"
                  f" bf16 {act['kv_cache_bf16']:.2f} GB, fp32 {act['kv_cache_fp32']:.2f} GB"]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--params", help="parameter count of one model: 7B, 494M, 0.5e9 (default: the chapter's rows)")
    size.add_argument("--config", help="model folder, config.json or Hugging Face id; parameters counted from it")
    parser.add_argument("--lora-rank", type=POSITIVE_INT, default=16, help="LoRA rank (default 16, the chapter's)")
    parser.add_argument("--batch", type=POSITIVE_INT, default=16, help="sequences per forward pass (default 16)")
    parser.add_argument("--seq-len", type=POSITIVE_INT, default=512,
                        help="tokens per sequence, prompt + reply (default 512)")
    parser.add_argument("--vocab", type=POSITIVE_INT, help="vocabulary size for the logits (default: from the model)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def run(args: argparse.Namespace) -> int:
    if args.config:
        shape = shape_from_config(args.config)
        rows = [(shape.name, shape.parameters)]
    elif args.params:
        parameters = parse_parameter_count(args.params)
        shape, rows = representative_shape(parameters), [(f"{parameters:,} parameters", parameters)]
    else:
        shape, rows = QWEN25_05B, BOOK_ROWS
    report = build_report(rows, shape, args.lora_rank, args.batch, args.seq_len, args.vocab)
    print(json.dumps(report) if args.json else format_report(report))
    return 0
