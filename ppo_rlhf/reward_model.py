"""Bradley-Terry reward-model training (`ppo-rlhf reward-model train`).

The reward model is a sequence classifier built on the policy's own backbone and tokenizer, with LoRA on
the seven linear layers of every block and a trainable one-output score head. Each (prompt, reply) is
chat-formatted and scored at the reply's closing EOS by scores.reward_inputs / reward_scores, the exact
functions PPO scores with, so training and use read the same position. The loss is

    -log sigmoid(r(x, chosen) - r(x, rejected))

and the output folder is a PEFT adapter (LoRA + score head) that models.load_sequence_classifier loads.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ppo_rlhf.config import POSITIVE_FLOAT, POSITIVE_INT, SEED, Bounds, Checked, FieldType
from ppo_rlhf.errors import require
from ppo_rlhf.files import atomic_directory
from ppo_rlhf.models import (
    LoraSettings,
    add_value_lora,
    count_parameters,
    load_sequence_classifier,
    load_tokenizer,
    resolve_model_path,
)
from ppo_rlhf.pairs import pair_from_record, read_pairs
from ppo_rlhf.precision import DTYPES, resolve_dtype
from ppo_rlhf.prompts import load_hf_dataset
from ppo_rlhf.scores import reward_inputs, reward_scores
from ppo_rlhf.stats import pearson
from ppo_rlhf.train_config import resolve_device


def load_pair_source(source: str) -> list[dict]:
    """Pairs of a JSONL file or of `hf:DATASET[:SPLIT]` (e.g. hf:HuggingFaceH4/ultrafeedback_binarized:train_prefs)."""
    if not source.startswith("hf:"):
        return read_pairs(source)
    name, split = (source.removeprefix("hf:").split(":") + ["train"])[:2]
    require(bool(name), f"no dataset name in {source!r}; use hf:DATASET[:SPLIT]")
    dataset = load_hf_dataset(name, split)
    rows = enumerate(tqdm(dataset, desc="reading pairs"))
    return [pair_from_record(row, f"{name}[{split}] row {i}") for i, row in rows]


def pair_scores(model, tokenizer, pairs: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(r_chosen [B], r_rejected [B], len(chosen) - len(rejected) in tokens [B]) in one forward pass."""
    prompts = [p["prompt"] for p in pairs]
    replies = [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs]
    input_ids, attention_mask = reward_inputs(tokenizer, prompts + prompts, replies)
    device = next(model.parameters()).device
    scores = reward_scores(model, input_ids.to(device), attention_mask.to(device))
    lengths = attention_mask.sum(dim=1)
    n = len(pairs)
    return scores[:n], scores[n:], lengths[:n] - lengths[n:]


def sequence_lengths(tokenizer, pairs: list[dict], chunk: int = 256) -> list[int]:
    """The longer of each pair's two conversations, in tokens."""
    longest = []
    for start in tqdm(range(0, len(pairs), chunk), desc="tokenizing pairs", leave=False):
        part = pairs[start : start + chunk]
        prompts = [p["prompt"] for p in part]
        replies = [p["chosen"] for p in part] + [p["rejected"] for p in part]
        _, mask = reward_inputs(tokenizer, prompts + prompts, replies)
        lengths = mask.sum(dim=1).tolist()
        longest += [max(a, b) for a, b in zip(lengths[: len(part)], lengths[len(part) :])]
    return longest


@torch.no_grad()
def evaluate_pairs(model, tokenizer, pairs: list[dict], batch_size: int) -> dict:
    """Pair accuracy, mean margin, and the length bias: corr(len(chosen) - len(rejected), r_chosen - r_rejected)."""
    model.eval()
    margins, length_gaps = [], []
    for start in range(0, len(pairs), batch_size):
        chosen, rejected, gap = pair_scores(model, tokenizer, pairs[start : start + batch_size])
        margins += (chosen - rejected).tolist()
        length_gaps += gap.tolist()
    corr = pearson(length_gaps, margins)
    return {
        "accuracy": sum(m > 0 for m in margins) / len(margins),
        "mean_margin": sum(margins) / len(margins),
        "length_corr": None if corr != corr else corr,  # nan (constant lengths) -> null in JSON
    }


def save_atomically(model, tokenizer, info: dict, out_dir: Path) -> None:
    """Write the adapter folder under a temporary name and rename it into place."""
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "rm_info.json").write_text(json.dumps(info, indent=2) + "\n")


def train_reward_model(
    pairs_source: str | Path,
    base: str = "smollm2",
    out_dir: str | Path = "rm",
    epochs: int = 2,
    lr: float = 1e-4,
    batch_size: int = 8,
    lora_rank: int = 16,
    heldout_fraction: float = 0.1,
    seed: int = 0,
    max_length: int = 512,
    device: str | None = None,
    dtype: str = "auto",
) -> dict:
    """Train on the pairs, write OUT (adapter + score head + tokenizer + rm_info.json); return rm_info."""
    require(epochs >= 1 and batch_size >= 1 and lora_rank >= 1, "--epochs, --batch-size and --lora-rank must be >= 1")
    require(lr > 0, f"--lr must be > 0, got {lr}")
    require(0 < heldout_fraction < 1, f"--heldout-fraction must be in (0, 1), got {heldout_fraction}")
    started = time.time()
    pairs = load_pair_source(str(pairs_source))
    tokenizer = load_tokenizer(base)
    # A cut-off conversation would lose its closing EOS, the token the score is read at: drop, don't truncate.
    lengths = sequence_lengths(tokenizer, pairs)
    usable = [p for p, n in zip(pairs, lengths) if n <= max_length]
    require(len(usable) >= 2, f"{len(usable)} of {len(pairs)} pairs fit in --max-length {max_length}; need at least 2")
    random.Random(seed).shuffle(usable)
    n_heldout = max(1, round(heldout_fraction * len(usable)))
    require(len(usable) - n_heldout >= 1, f"no training pairs left after holding out {n_heldout} of {len(usable)}")
    heldout, train = usable[:n_heldout], usable[n_heldout:]

    torch.manual_seed(seed)  # the fresh score head is random
    device = resolve_device(device or "auto")
    # a half dtype stores the frozen backbone in it; LoRA and the score head (what is saved) train in fp32
    frozen_dtype = resolve_dtype(dtype, device)
    model = add_value_lora(load_sequence_classifier(base, frozen_dtype),
                           LoraSettings(rank=lora_rank, alpha=2.0 * lora_rank))
    model.to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=0.0, fused=True)
    before = evaluate_pairs(model, tokenizer, heldout, batch_size)

    generator = torch.Generator().manual_seed(seed)
    epoch_losses = []
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(train), generator=generator).tolist()
        total, correct, seen = 0.0, 0, 0
        bar = tqdm(range(0, len(order), batch_size), desc=f"epoch {epoch + 1}/{epochs}", unit="batch")
        for start in bar:
            batch = [train[i] for i in order[start : start + batch_size]]
            chosen, rejected, _ = pair_scores(model, tokenizer, batch)
            loss = -F.logsigmoid(chosen - rejected).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            total += loss.item() * len(batch)
            correct += int((chosen > rejected).sum())
            seen += len(batch)
            bar.set_postfix(loss=f"{total / seen:.4f}", acc=f"{correct / seen:.3f}")
        epoch_losses.append(total / seen)
    after = evaluate_pairs(model, tokenizer, heldout, batch_size)

    # The adapter must name the folder its weights apply to, not an alias like "smollm2".
    model.peft_config["default"].base_model_name_or_path = resolve_model_path(base)
    info = {
        "base": base,
        "base_path": resolve_model_path(base),
        "pairs_source": str(pairs_source) if str(pairs_source).startswith("hf:") else str(Path(pairs_source).resolve()),
        "pairs": len(pairs),
        "dropped_too_long": len(pairs) - len(usable),
        "train_pairs": len(train),
        "heldout_pairs": len(heldout),
        "epochs": epochs,
        "lr": lr,
        "batch_size": batch_size,
        "lora_rank": lora_rank,
        "max_length": max_length,
        "seed": seed,
        "dtype": str(frozen_dtype).removeprefix("torch."),
        "trainable_parameters": count_parameters(model)[0],
        "train_loss": epoch_losses,
        "before": before,
        "after": after,
        "seconds": round(time.time() - started, 1),
    }
    save_atomically(model, tokenizer, info, Path(out_dir))
    return info


def summary_line(info: dict) -> str:
    """The result of a training in words, one line (for `reward-model train` and the demo)."""
    before, after = info["before"], info["after"]
    corr = "n/a (equal lengths)" if after["length_corr"] is None else f"{after['length_corr']:+.2f}"
    return (f"reward model: held-out accuracy {after['accuracy']:.2f} on {info['heldout_pairs']} pairs "
            f"({before['accuracy']:.2f} before training, {info['train_pairs']} training pairs), "
            f"score-length correlation {corr}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    train = actions.add_parser("train", help="train a reward model on preference pairs")
    train.add_argument("--pairs", required=True, help="pairs JSONL (ppo-rlhf pairs) or hf:DATASET[:SPLIT]")
    train.add_argument("--base", default="smollm2", help="backbone and tokenizer (the policy's)")
    train.add_argument("--out", required=True, help="output folder (PEFT adapter + score head + tokenizer)")
    train.add_argument("--epochs", type=POSITIVE_INT, default=2)
    train.add_argument("--lr", type=POSITIVE_FLOAT, default=1e-4)
    train.add_argument("--batch-size", type=POSITIVE_INT, default=8, help="pairs per step")
    train.add_argument("--lora-rank", type=POSITIVE_INT, default=16)
    train.add_argument("--heldout-fraction", type=Checked(float, Bounds(0, 1, low_open=True, high_open=True)), default=0.1, help="pairs kept out to measure accuracy")
    train.add_argument("--seed", type=SEED, default=0)
    train.add_argument("--max-length", type=POSITIVE_INT, default=512, help="longer conversations are dropped, not cut")
    train.add_argument("--dtype", type=Checked(FieldType(str, choices=DTYPES)), default="auto",
                       help="frozen backbone's dtype (auto: bfloat16 where the hardware has it natively; LoRA and head fp32)")


def run(args: argparse.Namespace) -> int:
    info = train_reward_model(
        args.pairs,
        base=args.base,
        out_dir=args.out,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        lora_rank=args.lora_rank,
        heldout_fraction=args.heldout_fraction,
        seed=args.seed,
        max_length=args.max_length,
        dtype=args.dtype,
    )
    print(f"wrote {args.out}; {summary_line(info)}")
    return 0
