"""Bradley-Terry reward-model training (`ppo-rlhf reward-model train`).

The reward model is a sequence classifier built on the policy's own backbone and tokenizer, with LoRA on
the seven linear layers of every block and a trainable one-output score head. Each (prompt, reply) is
chat-formatted and scored at the reply's closing EOS by scores.reward_inputs / reward_scores, the exact
functions PPO scores with, so training and use read the same position. The loss is

    -log sigmoid(r(x, chosen) - r(x, rejected))

and the output folder is a PEFT adapter (LoRA + score head) that models.load_sequence_classifier loads.

With --length-head the loss is -log sigmoid(r(x, chosen) - r(x, rejected) + w * length gap / scale): one learned
scalar w takes what the replies' length difference explains (length_bias.py), so the score head learns the rest; w
is not part of the saved model, which scores quality only and loads as any other.

Held-out accuracy is measured on a held-out share of the pairs, or on a separate pairs file (pairs of prompts the
model never trained on, as the demo makes them). The learning curve, held-out accuracy after the first 1/8, 1/4,
1/2 and all of the training pairs of the first pass (and after each later epoch), is measured inside the one training
run rather than by training once per size: the same curve's shape for a fraction of the compute. It says whether
more pairs would help (still rising) or the backbone is the limit (flat). Every held-out measurement also says how
much of the accuracy length alone would give (length_bias.length_report: accuracy on similar-length and on
shorter-chosen pairs, the score's correlation with reply length, the paired difference to word counts).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from ppo_rlhf.config import POSITIVE_FLOAT, POSITIVE_INT, SEED, Bounds, Checked, FieldType, add_threads_argument
from ppo_rlhf.errors import require
from ppo_rlhf.study.length_bias import length_fit, length_report, length_scale, report_line
from ppo_rlhf.study.pairs import LENGTH_TOLERANCE, pair_from_record, read_pairs
from ppo_rlhf.study.prompts import load_hf_dataset
from ppo_rlhf.study.stats import pearson
from ppo_rlhf.study.word_baseline import CURVE_FRACTIONS, word_margins
from ppo_rlhf.utils.device import DTYPE_NAMES, resolve_device
from ppo_rlhf.utils.files import atomic_directory
from ppo_rlhf.utils.paths import check_model_name

if TYPE_CHECKING:  # torch, transformers and the models are imported where used: `reward-model train` checks its
    import torch  # files before they load


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
    chosen, rejected, gaps, _ = scored_pairs(model, tokenizer, pairs)
    return chosen, rejected, gaps


def scored_pairs(model, tokenizer, pairs: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """pair_scores and {(prompt, reply): score} of each distinct conversation of the pairs.

    Each distinct (prompt, reply) conversation is scored once however many pairs it is in: K replies of a prompt
    make up to K(K-1)/2 pairs from K forward passes instead of K(K-1) (InstructGPT trains on all comparisons of
    a prompt as one batch element for this reason).
    """
    import torch

    from ppo_rlhf.models.scores import reward_inputs, reward_scores

    conversations = [(p["prompt"], p["chosen"]) for p in pairs] + [(p["prompt"], p["rejected"]) for p in pairs]
    distinct = list(dict.fromkeys(conversations))
    row = {conversation: k for k, conversation in enumerate(distinct)}
    input_ids, attention_mask = reward_inputs(tokenizer, [c[0] for c in distinct], [c[1] for c in distinct])
    device = next(model.parameters()).device
    scores = reward_scores(model, input_ids.to(device), attention_mask.to(device))
    lengths = attention_mask.sum(dim=1)
    index = torch.tensor([row[c] for c in conversations])
    n = len(pairs)
    chosen, rejected = index[:n], index[n:]
    by_conversation = dict(zip(distinct, scores.tolist()))
    return scores[chosen.to(device)], scores[rejected.to(device)], lengths[chosen] - lengths[rejected], by_conversation


def bradley_terry_logits(chosen: torch.Tensor, rejected: torch.Tensor, gaps: torch.Tensor,
                         weight: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
    """r(chosen) - r(rejected), plus weight * gaps / scale with a length term: the length expert's share of the
    logit, which the score head then need not learn (fp32)."""
    logits = (chosen - rejected).float()
    return logits if weight is None else logits + weight * gaps.float() / scale


def pair_order(pairs: list[dict], generator: torch.Generator, shuffle_pairs: bool) -> list[int]:
    """One epoch's order of the pairs: prompt_order, or with shuffle_pairs every pair on its own (a batch then mixes
    prompts: more distinct replies to score per pair, and no batch dominated by one prompt's replies)."""
    import torch

    return torch.randperm(len(pairs), generator=generator).tolist() if shuffle_pairs else prompt_order(pairs, generator)


def prompt_order(pairs: list[dict], generator: torch.Generator) -> list[int]:
    """Pair indices in a random order of prompts, the pairs of one prompt together (in random order too), so that
    a batch holds several pairs of a prompt and pair_scores scores each of their replies once."""
    import torch

    groups: dict[str, list[int]] = {}
    for k, pair in enumerate(pairs):
        groups.setdefault(pair["prompt"], []).append(k)
    members = list(groups.values())
    order = []
    for g in torch.randperm(len(members), generator=generator).tolist():
        order += [members[g][i] for i in torch.randperm(len(members[g]), generator=generator).tolist()]
    return order


def sequence_lengths(tokenizer, pairs: list[dict], chunk: int = 256) -> list[tuple[int, int]]:
    """(chosen, rejected) conversation lengths of each pair, in tokens."""
    from ppo_rlhf.models.scores import reward_inputs

    both = []
    for start in tqdm(range(0, len(pairs), chunk), desc="tokenizing pairs", leave=False):
        part = pairs[start : start + chunk]
        prompts = [p["prompt"] for p in part]
        replies = [p["chosen"] for p in part] + [p["rejected"] for p in part]
        _, mask = reward_inputs(tokenizer, prompts + prompts, replies)
        lengths = mask.sum(dim=1).tolist()
        both += list(zip(lengths[: len(part)], lengths[len(part) :]))
    return both


def pair_margins(model, tokenizer, pairs: list[dict], batch_size: int) -> tuple[list[float], list[int], dict]:
    """(r_chosen - r_rejected, len(chosen) - len(rejected)) of every pair, in their order, and {(prompt, reply):
    score} of every distinct conversation; the model in eval mode."""
    import torch

    model.eval()
    margins, length_gaps, scores = [], [], {}
    for start in range(0, len(pairs), batch_size):
        with torch.no_grad():
            chosen, rejected, gap, by_conversation = scored_pairs(model, tokenizer, pairs[start : start + batch_size])
        margins += (chosen - rejected).tolist()
        length_gaps += gap.tolist()
        scores.update(by_conversation)
    return margins, length_gaps, scores


def evaluate_pairs(model, tokenizer, pairs: list[dict], batch_size: int) -> dict:
    """Pair accuracy, mean margin, and the length bias: corr(len(chosen) - len(rejected), r_chosen - r_rejected)."""
    return margin_summary(*pair_margins(model, tokenizer, pairs, batch_size)[:2])


def reply_tokens(tokenizer, texts: list[str]) -> list[int]:
    """Each reply's length in tokens, on its own (no prompt, no chat template)."""
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def margin_summary(margins: list[float], length_gaps: list[int]) -> dict:
    """evaluate_pairs' numbers from the margins and length differences of the pairs."""
    corr = pearson(length_gaps, margins)
    return {
        "accuracy": sum(m > 0 for m in margins) / len(margins),
        "mean_margin": sum(margins) / len(margins),
        "length_corr": None if corr != corr else corr,  # nan (constant lengths) -> null in JSON
    }


def curve_steps(n_train: int, batch_size: int) -> dict[int, int]:
    """{optimiser step (1-based) of the first epoch: training pairs seen after it} for the learning curve's points
    (CURVE_FRACTIONS and the end of the pass); a fraction too small for one batch has no point."""
    steps = {}
    for fraction in CURVE_FRACTIONS:
        seen = round(fraction * n_train)
        if seen >= batch_size:  # at least one full step
            steps[-(-seen // batch_size)] = min(n_train, -(-seen // batch_size) * batch_size)
    steps[-(-n_train // batch_size)] = n_train
    return steps


def save_atomically(model, tokenizer, info: dict, out_dir: Path) -> None:
    """Write the adapter folder under a temporary name and rename it into place."""
    with atomic_directory(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "rm_info.json").write_text(json.dumps(info, indent=2) + "\n")
        (tmp / "learning_curve.json").write_text(json.dumps(info["learning_curve"], indent=1) + "\n")


def split_pairs(tokenizer, pairs: list[dict], given: list[dict] | None, max_length: int, heldout_fraction: float,
                seed: int) -> tuple[list[dict], list[dict], int]:
    """(training pairs, held-out pairs, pairs dropped as too long): `given` held out whole when there is one, else a
    seeded `heldout_fraction` of the pairs. A cut-off conversation would lose its closing EOS, the token the score is
    read at: a pair longer than `max_length` is dropped, not truncated."""

    def fitting(pairs: list[dict]) -> list[dict]:
        return [p for p, n in zip(pairs, sequence_lengths(tokenizer, pairs)) if max(n) <= max_length]

    usable = fitting(pairs)
    random.Random(seed).shuffle(usable)
    if given is None:
        require(len(usable) >= 2, f"{len(usable)} of {len(pairs)} pairs fit in --max-length {max_length}; need 2")
        n_heldout = max(1, round(heldout_fraction * len(usable)))
        require(len(usable) - n_heldout >= 1, f"no training pairs left after holding out {n_heldout} of {len(usable)}")
        return usable[n_heldout:], usable[:n_heldout], len(pairs) - len(usable)
    heldout, train = fitting(given), usable
    require(len(train) >= 1, f"none of {len(pairs)} pairs fits in --max-length {max_length}")
    require(len(heldout) >= 1, f"none of {len(given)} held-out pairs fits in --max-length {max_length}")
    return train, heldout, len(pairs) + len(given) - len(train) - len(heldout)


def pair_loss(model, tokenizer, batch: list[dict], weight, scale: float, device):
    """(the Bradley-Terry loss of a batch of pairs, its logits): -log sigmoid(chosen - rejected [+ the length
    term]), mean over the batch."""
    import torch.nn.functional as F

    chosen, rejected, gaps = pair_scores(model, tokenizer, batch)
    logits = bradley_terry_logits(chosen, rejected, gaps.to(device), weight, scale)
    return -F.logsigmoid(logits).mean(), logits


def train_epochs(loss_of_batch: Callable, optimizer, trainable: list, model, train: list[dict], epochs: int,
                 batch_size: int, seed: int, shuffle_pairs: bool, measure: Callable[[int, int], None]) -> list[float]:
    """The optimiser's passes over the training pairs (gradients clipped to norm 1); `measure(pairs seen, epochs
    done)` at the learning curve's points of the first pass (`curve_steps`) and after each later epoch. Returns
    each epoch's mean loss."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    epoch_losses = []
    curve_at = curve_steps(len(train), batch_size)
    for epoch in range(epochs):
        model.train()
        order = pair_order(train, generator, shuffle_pairs)
        total, correct, seen = 0.0, 0, 0
        bar = tqdm(range(0, len(order), batch_size), desc=f"epoch {epoch + 1}/{epochs}", unit="batch")
        for step, start in enumerate(bar, start=1):
            batch = [train[i] for i in order[start : start + batch_size]]
            loss, logits = loss_of_batch(batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optimizer.step()
            total += loss.item() * len(batch)
            correct += int((logits > 0).sum())
            seen += len(batch)
            bar.set_postfix(loss=f"{total / seen:.4f}", acc=f"{correct / seen:.3f}")
            if epoch == 0 and step in curve_at:  # the last step of the first pass is one of them
                measure(curve_at[step], 1)
        epoch_losses.append(total / seen)
        if epoch > 0:
            measure(len(train), epoch + 1)
    return epoch_losses


def length_term(tokenizer, train: list[dict], device):
    """(scale in tokens, weight) of the length expert: one trained scalar, started at what length alone says of the
    training pairs (length_bias.length_fit)."""
    import torch

    train_gaps = [a - b for a, b in sequence_lengths(tokenizer, train)]
    scale = length_scale(train_gaps)
    return scale, torch.tensor(length_fit([g / scale for g in train_gaps]), device=device, requires_grad=True)


def heldout_measure(model, tokenizer, train: list[dict], heldout: list[dict], batch_size: int, length_tolerance: int,
                    seed: int, on_heldout: Callable[[dict, list[dict], list[float]], None] | None
                    ) -> Callable[[int, int], dict]:
    """measure(pairs seen, epochs done) -> a learning-curve point: the held-out margins' summary and the length
    report (on_heldout gets every margin). Its fixed parts are computed once, here: each distinct reply's length, and
    the word baseline fitted on the training pairs."""
    heldout_prompts = [p["prompt"] for p in heldout]
    replies = list(dict.fromkeys((p["prompt"], p[side]) for p in heldout for side in ("chosen", "rejected")))
    reply_lengths = reply_tokens(tokenizer, [reply for _, reply in replies])
    words = word_margins(train, heldout, seed)[len(train)].tolist()

    def measure(pairs_seen: int, epochs_done: int) -> dict:
        margins, length_gaps, scores = pair_margins(model, tokenizer, heldout, batch_size)
        report = length_report(margins, length_gaps, heldout_prompts, [scores[r] for r in replies], reply_lengths,
                               words, length_tolerance, seed)
        point = {"pairs": pairs_seen, "epochs": epochs_done, **margin_summary(margins, length_gaps),
                 "length": report}
        if on_heldout is not None:
            on_heldout(point, heldout, margins)
        model.train()
        return point

    return measure


@dataclass(frozen=True)
class RewardModelTraining:
    """How `train_reward_model` trains: the flags of `ppo-rlhf reward-model train` (the demo's --rm-* settings).
    Checked when made, so a bad value stops before any file is read."""

    base: str = "smollm2"
    """Backbone and tokenizer (the policy's): a model folder, a hub id or "smollm2"."""
    epochs: int = 2
    """Passes over the training pairs."""
    lr: float = 1e-4
    """Learning rate of the LoRA adapter and the score head (and of the length term's weight)."""
    batch_size: int = 8
    """Pairs per optimiser step (and per forward pass when measuring)."""
    lora_rank: int = 16
    """LoRA rank (alpha is twice it)."""
    lora_layers: int = 0
    """LoRA on the last N blocks only (0: every block); backward stops there, so fewer is faster."""
    heldout_fraction: float = 0.1
    """Share of the pairs held out to measure accuracy, when no held-out pairs file is given."""
    seed: int = 0
    """Seed of the held-out split, the fresh score head and LoRA, the batch order and the word baseline."""
    max_length: int = 512
    """Tokens: a longer conversation is dropped, not cut (a cut one would lose the closing EOS its score is read at)."""
    device: str | None = None
    """"cpu", "cuda", "cuda:N" or "auto" (None: "auto")."""
    dtype: str = "auto"
    """The frozen backbone's dtype (auto: bfloat16 where the hardware has it natively); LoRA and the head train in
    fp32."""
    shuffle_pairs: bool = False
    """Batches of pairs in random order rather than whole prompts' pairs together (pair_order)."""
    length_head: bool = False
    """Train against the length term (the module docstring); the saved model scores without it."""
    length_tolerance: int = LENGTH_TOLERANCE
    """Tokens: held-out pairs this close in length are the "similar-length" ones of the length report."""

    def __post_init__(self) -> None:
        require(self.epochs >= 1 and self.batch_size >= 1 and self.lora_rank >= 1,
                "--epochs, --batch-size and --lora-rank must be >= 1")
        require(self.lr > 0, f"--lr must be > 0, got {self.lr}")
        require(0 < self.heldout_fraction < 1, f"--heldout-fraction must be in (0, 1), got {self.heldout_fraction}")
        require(self.length_tolerance >= 0, f"--length-tolerance must be >= 0, got {self.length_tolerance}")


def train_reward_model(pairs_source: str | Path, out_dir: str | Path = "rm",
                       training: RewardModelTraining = RewardModelTraining(),
                       heldout_source: str | Path | None = None,
                       on_heldout: Callable[[dict, list[dict], list[float]], None] | None = None) -> dict:
    """Train on the pairs as `training` says, write OUT (adapter + score head + tokenizer + rm_info.json +
    learning_curve.json); return rm_info. With heldout_source, every pair of it is held out and every pair of
    pairs_source trains.

    on_heldout(point, heldout_pairs, margins) is called at every held-out measurement (each learning-curve point:
    before training, during the first pass, after each epoch) with the margin of every held-out pair, for callers
    that want more than the accuracy (bench/rm_search.py's prompt-clustered intervals)."""
    started = time.time()
    pairs = load_pair_source(str(pairs_source))
    given = None if heldout_source is None else load_pair_source(str(heldout_source))
    check_model_name(training.base)
    # lazy: the files and the model name are checked above, before torch and transformers load
    from ppo_rlhf.models.loading import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(training.base)
    train, heldout, dropped = split_pairs(tokenizer, pairs, given, training.max_length, training.heldout_fraction,
                                          training.seed)
    model, device, frozen_dtype = model_to_train(training)
    scale, weight = length_term(tokenizer, train, device) if training.length_head else (1.0, None)
    started_weight = None if weight is None else weight.item()
    measure = heldout_measure(model, tokenizer, train, heldout, training.batch_size, training.length_tolerance,
                              training.seed, on_heldout)
    curve = [measure(0, 0)]
    epoch_losses = optimise(model, tokenizer, train, training, weight, scale, device,
                            lambda seen, done: curve.append(measure(seen, done)))
    length_head = None if weight is None else {"scale_tokens": round(scale, 3), "start_weight": started_weight,
                                                "weight": weight.item()}

    # The adapter must name the folder its weights apply to, not an alias like "smollm2".
    model.peft_config["default"].base_model_name_or_path = resolve_model_path(training.base)
    info = {
        "base": training.base,
        "base_path": resolve_model_path(training.base),
        "pairs_source": str(pairs_source) if str(pairs_source).startswith("hf:") else str(Path(pairs_source).resolve()),
        "pairs": len(pairs),
        "dropped_too_long": dropped,
        "heldout_source": None if heldout_source is None else str(Path(heldout_source).resolve()),
        "train_pairs": len(train),
        "heldout_pairs": len(heldout),
        **settings_record(training, length_head, frozen_dtype),
        **outcome_record(model, epoch_losses, curve, started),
    }
    save_atomically(model, tokenizer, info, Path(out_dir))
    return info


def model_to_train(training: RewardModelTraining) -> tuple[Any, torch.device, torch.dtype]:
    """(the sequence classifier to train, its device, the frozen backbone's dtype): the backbone frozen, LoRA and a
    fresh score head, both seeded since both start random."""
    import torch

    from ppo_rlhf.models.loading import LoraSettings, add_value_lora, load_sequence_classifier
    from ppo_rlhf.models.precision import resolve_dtype

    torch.manual_seed(training.seed)  # the fresh score head is random
    device = resolve_device(training.device or "auto")
    # a half dtype stores the frozen backbone in it; LoRA and the score head (what is saved) train in fp32
    frozen_dtype = resolve_dtype(training.dtype, device)
    lora = LoraSettings(rank=training.lora_rank, alpha=2.0 * training.lora_rank, top_layers=training.lora_layers)
    model = add_value_lora(load_sequence_classifier(training.base, frozen_dtype, init_score_head=True), lora)
    model.to(device)
    return model, device, frozen_dtype


def optimise(model, tokenizer, train: list[dict], training: RewardModelTraining, weight: torch.Tensor | None,
             scale: float, device, measure: Callable[[int, int], None]) -> list[float]:
    """train_epochs with AdamW (no weight decay) on every trainable weight: LoRA, the score head and the length
    term's weight when there is one; returns each epoch's mean loss."""
    import torch

    trainable = [p for p in model.parameters() if p.requires_grad]
    if weight is not None:
        trainable.append(weight)
    optimizer = torch.optim.AdamW(trainable, lr=training.lr, weight_decay=0.0, fused=True)
    loss_of_batch = functools.partial(pair_loss, model, tokenizer, weight=weight, scale=scale, device=device)
    return train_epochs(loss_of_batch, optimizer, trainable, model, train, training.epochs, training.batch_size,
                        training.seed, training.shuffle_pairs, measure)


def settings_record(training: RewardModelTraining, length_head: dict | None, frozen_dtype: torch.dtype) -> dict:
    """rm_info.json's settings of the training, in their order there (the dtype resolved: "auto" names no dtype)."""
    from ppo_rlhf.models.precision import dtype_name

    return {
        "epochs": training.epochs,
        "lr": training.lr,
        "batch_size": training.batch_size,
        "lora_rank": training.lora_rank,
        "lora_layers": training.lora_layers or "all",
        "shuffle_pairs": training.shuffle_pairs,
        "length_head": length_head,
        "length_tolerance": training.length_tolerance,
        "max_length": training.max_length,
        "seed": training.seed,
        "dtype": dtype_name(frozen_dtype),
    }


def outcome_record(model, epoch_losses: list[float], curve: list[dict], started: float) -> dict:
    """rm_info.json's results: the losses, the held-out numbers before and after training (the learning curve's
    first and last points), the length report of the last, the curve, the time taken since `started`."""
    from ppo_rlhf.models.loading import count_parameters

    before = {key: value for key, value in curve[0].items() if key not in ("pairs", "epochs", "length")}
    return {
        "trainable_parameters": count_parameters(model)[0],
        "train_loss": epoch_losses,
        "before": before,
        "after": {key: curve[-1][key] for key in before},
        "heldout": curve[-1]["length"],
        "learning_curve": curve,
        "seconds": round(time.time() - started, 1),
    }


def summary_line(info: dict) -> str:
    """The result of a training in words, one line (for `reward-model train` and the demo)."""
    before, after = info["before"], info["after"]
    corr = "n/a (equal lengths)" if after["length_corr"] is None else f"{after['length_corr']:+.2f}"
    head = info.get("length_head")
    return (f"reward model: held-out accuracy {after['accuracy']:.2f} on {info['heldout_pairs']} pairs "
            f"({before['accuracy']:.2f} before training, {info['train_pairs']} training pairs), "
            f"score-length correlation {corr}; {report_line(info['heldout'])}"
            + ("" if head is None else f"; length term weight {head['weight']:+.2f} per {head['scale_tokens']:.0f} "
                                       "tokens (dropped when scoring)"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    train = actions.add_parser("train", help="train a reward model on preference pairs")
    train.add_argument("--pairs", required=True, help="pairs JSONL (ppo-rlhf pairs) or hf:DATASET[:SPLIT]")
    add_threads_argument(train)
    train.add_argument("--base", default="smollm2", help="backbone and tokenizer (the policy's)")
    train.add_argument("--out", required=True, help="output folder (PEFT adapter + score head + tokenizer)")
    train.add_argument("--epochs", type=POSITIVE_INT, default=2, help="passes over the training pairs (default 2)")
    train.add_argument("--lr", type=POSITIVE_FLOAT, default=1e-4,
                       help="learning rate of the LoRA adapter and the score head (default 1e-4)")
    train.add_argument("--batch-size", type=POSITIVE_INT, default=8, help="pairs per step")
    train.add_argument("--lora-rank", type=POSITIVE_INT, default=16, help="LoRA rank (default 16)")
    train.add_argument("--lora-layers", type=Checked(int, Bounds(low=0)), default=0,
                       help="LoRA on the last N blocks only (0: every block); backward stops there, so fewer is faster")
    train.add_argument("--shuffle-pairs", action="store_true",
                       help="batches of pairs in random order (default: a prompt's pairs together, each reply scored "
                            "once per step)")
    train.add_argument("--heldout-fraction", type=Checked(float, Bounds(0, 1, low_open=True, high_open=True)),
                       default=0.1, help="pairs kept out to measure accuracy")
    train.add_argument("--seed", type=SEED, default=0,
                       help="seed of the held-out split and the batch order (default 0)")
    train.add_argument("--max-length", type=POSITIVE_INT, default=512, help="longer conversations are dropped, not cut")
    train.add_argument("--heldout-pairs", default=None,
                       help="a pairs JSONL held out whole (pairs of other prompts); then --heldout-fraction is unused")
    train.add_argument("--dtype", type=Checked(FieldType(str, choices=DTYPE_NAMES)), default="auto",
                       help="frozen backbone's dtype (auto: bfloat16 where the hardware has it natively; LoRA and "
                            "head fp32)")
    train.add_argument("--length-head", action="store_true",
                       help="train against a learned length term (logit + w * length gap), dropped from the saved "
                            "model: the score head learns what length does not explain")
    train.add_argument("--length-tolerance", type=Checked(int, Bounds(low=0)), default=LENGTH_TOLERANCE,
                       help="tokens: held-out pairs this close in length are reported apart (similar-length accuracy)")


def run(args: argparse.Namespace) -> int:
    training = RewardModelTraining(
        base=args.base,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        lora_rank=args.lora_rank,
        lora_layers=args.lora_layers,
        heldout_fraction=args.heldout_fraction,
        seed=args.seed,
        max_length=args.max_length,
        dtype=args.dtype,
        shuffle_pairs=args.shuffle_pairs,
        length_head=args.length_head,
        length_tolerance=args.length_tolerance,
    )
    info = train_reward_model(args.pairs, out_dir=args.out, training=training, heldout_source=args.heldout_pairs)
    print(f"wrote {args.out}; {summary_line(info)}")
    return 0
