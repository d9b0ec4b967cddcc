"""Synthetic preference pairs (`ppo-rlhf pairs`): the Gao et al. (2022) set-up.

The starting policy samples several replies per prompt, a gold judge scores each, and every two replies of a
prompt whose gold scores differ by more than --min-margin become a pair, the better one "chosen". K replies give
K(K-1)/2 pairs for K generations, so labels are cheap (the judge is a lexicon, sampling is the cost), and the
margin drops near-ties whose label is mostly the judge's noise. A proxy reward model trained on these labels
(reward_model.py) is what PPO optimises, and the same gold judge later measures how much of PPO's gain is real.
Replies cut off at --reply-cap are never paired, since a reward model is only ever read at a closing EOS and the
EOS rule of PPO scores cut-off replies itself.

Length balance (--length-balance) breaks the shortcut of a proxy that learns "longer is better" (Singhal et al.,
2024): "similar" keeps only the pairs whose replies differ by at most --length-tolerance tokens, so length carries no
label; "half" keeps a seeded subsample in which the longer reply is the chosen one in exactly half of the pairs of
unequal length (per prompt where the prompt has both kinds, across prompts for the rest), so length alone ranks half
of them right, no better than a coin.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, NamedTuple

from tqdm import tqdm

from ppo_rlhf.config import NON_NEGATIVE, POSITIVE_FLOAT, POSITIVE_INT, SEED, Bounds, Checked, add_threads_argument
from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.study.prompts import message_text, read_jsonl, read_prompts, write_jsonl
from ppo_rlhf.utils.device import DTYPE_NAMES
from ppo_rlhf.utils.paths import check_model_name

PAIR_FIELDS = ("prompt", "chosen", "rejected", "score_chosen", "score_rejected")
LENGTH_BALANCES = ("none", "similar", "half")
LENGTH_TOLERANCE = 8  # tokens: "similar" pairs; about a fifth of the pool's pairs at a 64-token reply cap


def pair_from_record(record: dict, where: str) -> dict:
    """{"prompt", "chosen", "rejected"} strings from a record whose replies are strings or chat-message lists
    (UltraFeedback binarized: the last assistant message; the prompt, if absent, is the last user message)."""
    chosen = message_text(record.get("chosen"), "assistant")
    rejected = message_text(record.get("rejected"), "assistant")
    for field, text in (("chosen", chosen), ("rejected", rejected)):
        require(text is not None, f'{where}: "{field}" must be a string or chat messages with an assistant turn')
    prompt = record.get("prompt")
    if prompt is None:
        prompt = message_text(record.get("chosen"), "user")
    require(isinstance(prompt, str) and prompt.strip() != "", f'{where}: needs a non-empty "prompt" string')
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def read_pairs(path: str | Path) -> list[dict]:
    """Pairs of a JSONL file; the optional scores, if present, must be numbers."""
    pairs = []
    for number, row in read_jsonl(path):
        where = f"{path}:{number}"
        pair = pair_from_record(row, where)
        for field in ("score_chosen", "score_rejected"):
            if field in row:
                value = row[field]
                is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
                require(is_number, f'{where}: "{field}" must be a number')
                pair[field] = float(value)
        pairs.append(pair)
    return pairs


@dataclass
class JudgedReplies:
    """Judged start-policy replies, `k` per prompt: reply j of prompts[i] is row k*i + j of each list."""

    prompts: list[str]
    k: int
    texts: list[str]
    lengths: list[int]  # in tokens
    finished: list[bool]  # ended with EOS within the reply cap
    scores: list[float]  # the judge's
    judge: str


class Pairing(NamedTuple):
    rows: list[dict]  # PAIR_FIELDS of each pair
    close: int  # candidate pairs skipped: gold scores within min_margin
    cut_off: int  # candidate pairs skipped: a reply did not finish
    chosen_longer: int  # pairs whose chosen reply has more tokens
    unbalanced: int  # pairs dropped by the length balance


def sample_judged_replies(
    prompts: list[str],
    model: str = "smollm2",
    judge_spec: str = "gold",
    reply_cap: int = 128,
    temperature: float = 0.7,
    seed: int = 0,
    batch_size: int = 16,
    replies_per_prompt: int = 2,
    dtype: str = "auto",
) -> JudgedReplies:
    """Sample replies_per_prompt replies per prompt from the starting policy (on the CPU, seeded) and judge each."""
    require(bool(prompts), "no prompts to sample replies for")
    require(reply_cap >= 1 and temperature > 0, "--reply-cap must be >= 1 and --temperature > 0")
    require(batch_size >= 1, f"batch size must be >= 1, got {batch_size}")
    require(replies_per_prompt >= 1, f"--replies-per-prompt must be >= 1, got {replies_per_prompt}")
    check_model_name(model)
    # lazy: `ppo-rlhf pairs` checks its arguments and files (above) before torch and transformers load
    import torch

    from ppo_rlhf.models.loading import load_causal_lm, load_tokenizer
    from ppo_rlhf.models.precision import resolve_dtype
    from ppo_rlhf.models.rollout import generate_rollout
    from ppo_rlhf.study.judges import make_judge

    judge = make_judge(judge_spec)
    tokenizer = load_tokenizer(model)
    policy = load_causal_lm(model, resolve_dtype(dtype, torch.device("cpu")))  # sampling runs on the CPU here

    torch.manual_seed(seed)
    k = replies_per_prompt
    repeated = [p for p in prompts for _ in range(k)]  # rows k*i .. k*i+k-1 answer prompt i
    texts, lengths, finished = [], [], []
    for start in tqdm(range(0, len(repeated), batch_size), desc="sampling replies", unit="batch"):
        # drop_finished: finished replies leave the batch, as in training (generation_drop_finished)
        rollout = generate_rollout(policy, tokenizer, repeated[start : start + batch_size], reply_cap, temperature,
                                   drop_finished=True)
        texts += rollout.reply_texts
        lengths += rollout.reply_lengths.tolist()
        finished += rollout.finished.tolist()
    return JudgedReplies(list(prompts), k, texts, lengths, finished, judge.score(repeated, texts), judge.name)


def pair_replies(replies: JudgedReplies, min_margin: float, length_balance: str = "none",
                 length_tolerance: int = LENGTH_TOLERANCE, seed: int = 0) -> Pairing:
    """Every two finished replies of a prompt whose scores differ by more than min_margin, the better one chosen;
    then the length_balance subset (see `length_balanced`)."""
    k, texts, scores, lengths, finished = replies.k, replies.texts, replies.scores, replies.lengths, replies.finished
    rows: list[dict[str, Any]] = []
    gaps, close, unfinished = [], 0, 0
    for i, prompt in enumerate(replies.prompts):
        for a, b in combinations(range(k * i, k * i + k), 2):
            if not (finished[a] and finished[b]):
                unfinished += 1
                continue
            if abs(scores[a] - scores[b]) <= min_margin:  # with margin 0: a tie, no preference at all
                close += 1
                continue
            win, lose = (a, b) if scores[a] > scores[b] else (b, a)
            gaps.append(lengths[win] - lengths[lose])
            rows.append(dict(zip(PAIR_FIELDS, (prompt, texts[win], texts[lose], scores[win], scores[lose]))))
    keep = length_balanced([r["prompt"] for r in rows], gaps, length_balance, length_tolerance, seed)
    return Pairing([rows[i] for i in keep], close, unfinished, sum(gaps[i] > 0 for i in keep), len(rows) - len(keep))


def length_balanced(prompts: list[str], gaps: list[int], balance: str, tolerance: int = LENGTH_TOLERANCE,
                    seed: int = 0) -> list[int]:
    """Indices (in order) of the pairs a length balance keeps, given each pair's prompt and its chosen reply's length
    minus its rejected reply's (tokens).

    none: all. similar: |gap| <= tolerance. half: every pair of equal lengths, and as many longer-chosen as
    shorter-chosen pairs: within each prompt min(longer, shorter) of each kind (seeded draw), then of the prompts'
    surplus kinds as many of each as the other has; the longer reply is chosen in exactly half of the pairs of unequal
    length, and most prompts are balanced on their own, so which prompt a pair belongs to says little either.
    """
    require(balance in LENGTH_BALANCES, f"length balance must be one of {', '.join(LENGTH_BALANCES)}, got {balance!r}")
    require(tolerance >= 0, f"--length-tolerance must be >= 0, got {tolerance}")
    require(len(prompts) == len(gaps), f"{len(prompts)} prompts for {len(gaps)} length gaps")
    if balance == "none":
        return list(range(len(gaps)))
    if balance == "similar":
        return [i for i, gap in enumerate(gaps) if abs(gap) <= tolerance]
    rng = random.Random(seed)
    kinds: dict[str, tuple[list[int], list[int]]] = {}
    for i, (prompt, gap) in enumerate(zip(prompts, gaps)):
        if gap != 0:
            kinds.setdefault(prompt, ([], []))[gap < 0].append(i)
    keep = [i for i, gap in enumerate(gaps) if gap == 0]
    surplus: tuple[list[int], list[int]] = ([], [])
    for longer, shorter in kinds.values():
        n = min(len(longer), len(shorter))
        for side, members in enumerate((longer, shorter)):
            rng.shuffle(members)
            keep += members[:n]
            surplus[side].extend(members[n:])
    n = min(map(len, surplus))
    for members in surplus:
        keep += rng.sample(members, n)
    return sorted(keep)


def flip_labels(pairs: list[dict], fraction: float, seed: int) -> list[dict]:
    """The pairs with round(fraction * len(pairs)) of them, chosen by `seed`, flipped: chosen and rejected (and their
    scores) swapped, "flipped": true marking each. Label noise as Coste et al. (2024) add it (25% of the labels): a
    proxy trained on them learns a noisier preference, the kind that over-optimisation exploits sooner. An exact
    count, not a coin per pair, so that the stated rate is the rate."""
    require(0 <= fraction <= 1, f"label noise must be a fraction in [0, 1], got {fraction}")
    flipped = set(random.Random(seed).sample(range(len(pairs)), round(fraction * len(pairs))))
    swapped = {"chosen": "rejected", "rejected": "chosen", "score_chosen": "score_rejected",
               "score_rejected": "score_chosen"}
    return [({swapped.get(key, key): value for key, value in pair.items()} | {"flipped": True}) if k in flipped
            else pair for k, pair in enumerate(pairs)]


def pair_subset(pairs: list[dict], count: int | None, seed: int) -> list[dict]:
    """`count` of the pairs drawn by `seed` without replacement, in their order (None: all of them): a proxy trained
    on fewer comparisons of the same pool (Gao et al. 2022 varied the comparisons so). Pairs are drawn one by one,
    not by prompt: a small subset spans many prompts, a few pairs each."""
    if count is None:
        return list(pairs)
    require(1 <= count <= len(pairs), f"a subset of {count} pairs from a pool of {len(pairs)}")
    return [pairs[k] for k in sorted(random.Random(seed).sample(range(len(pairs)), count))]


def make_pairs(
    prompts: list[str] | str | Path,
    out_path: str | Path,
    model: str = "smollm2",
    judge_spec: str = "gold",
    reply_cap: int = 128,
    temperature: float = 0.7,
    seed: int = 0,
    batch_size: int = 16,
    replies_per_prompt: int = 2,
    min_margin: float = 0.0,
    dtype: str = "auto",
    length_balance: str = "none",
    length_tolerance: int = LENGTH_TOLERANCE,
) -> dict:
    """Sample replies_per_prompt replies per prompt, pair every two whose gold scores differ by more than
    min_margin, keep the length_balance subset (seeded), write the pairs JSONL; return the counts."""
    if not isinstance(prompts, list):
        prompts = read_prompts(prompts)
    require(bool(prompts), "no prompts to make pairs from")
    require(replies_per_prompt >= 2, f"--replies-per-prompt must be >= 2 to make a pair, got {replies_per_prompt}")
    require(min_margin >= 0, f"--min-margin must be >= 0, got {min_margin}")
    length_balanced([], [], length_balance, length_tolerance)  # a bad option is named before any sampling
    replies = sample_judged_replies(prompts, model, judge_spec, reply_cap, temperature, seed, batch_size,
                                    replies_per_prompt, dtype)
    rows, close, unfinished, chosen_longer, unbalanced = pair_replies(replies, min_margin, length_balance,
                                                                      length_tolerance, seed)
    if not rows:
        raise UsageError(f"no usable pair among {counted(len(prompts), 'prompt')} ({close} ties or within --min-margin "
                         f"{min_margin:g}, {unfinished} with a cut-off reply, {unbalanced} dropped by --length-balance "
                         f"{length_balance})")
    write_jsonl(out_path, rows)
    k = replies_per_prompt
    return {
        "judge": replies.judge,
        "prompts": len(prompts),
        "replies_per_prompt": k,
        "min_margin": min_margin,
        "candidate_pairs": len(prompts) * k * (k - 1) // 2,
        "pairs": len(rows),
        "close": close,
        "cut_off": unfinished,
        "length_balance": length_balance,
        "length_tolerance": length_tolerance,
        "unbalanced": unbalanced,
        "finished_replies": sum(replies.finished) / len(replies.finished),
        "mean_score_chosen": sum(r["score_chosen"] for r in rows) / len(rows),
        "mean_score_rejected": sum(r["score_rejected"] for r in rows) / len(rows),
        "chosen_longer_fraction": chosen_longer / len(rows),  # the length bias the labels carry
    }


def counted(n: int, noun: str, plural: str = "") -> str:
    """`1 prompt`, `3 prompts`; `1 reply`, `2 replies` (given the irregular plural)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def summary_line(info: dict) -> str:
    """The counts of `make_pairs` in words, one line (for `ppo-rlhf pairs` and the demo)."""
    return (f"pairs: {info['pairs']} from {counted(info['prompts'], 'prompt')} x "
            f"{counted(info['replies_per_prompt'], 'reply', 'replies')} "
            f"({info['close']} with a gold margin <= {info['min_margin']:g} and {info['cut_off']} with a cut-off reply "
            f"skipped{balance_words(info)}); {info['judge']} judge scores chosen {info['mean_score_chosen']:+.3f}, "
            f"rejected {info['mean_score_rejected']:+.3f}; chosen reply longer in {info['chosen_longer_fraction']:.0%}")


def balance_words(info: dict) -> str:
    """", 40 dropped by the length balance half" (nothing without a balance; older infos have none)."""
    balance = info.get("length_balance", "none")
    if balance == "none":
        return ""
    tolerance = f" (tolerance {info['length_tolerance']} tokens)" if balance == "similar" else ""
    return f", {info['unbalanced']} dropped by the length balance {balance}{tolerance}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", required=True, help='a {"prompt": ...} JSONL file (e.g. OUT/train.jsonl)')
    parser.add_argument("--out", required=True, help="output pairs JSONL")
    parser.add_argument("--model", default="smollm2", help="the starting policy that samples the replies")
    add_threads_argument(parser)
    parser.add_argument("--judge", default="gold", help="vader | nontoxic | gold | rm:PATH_OR_HUB_ID")
    parser.add_argument("--reply-cap", type=POSITIVE_INT, default=128, help="longest reply in tokens")
    parser.add_argument("--temperature", type=POSITIVE_FLOAT, default=0.7, help="sampling temperature (default 0.7)")
    parser.add_argument("--seed", type=SEED, default=0, help="sampling seed (default 0)")
    parser.add_argument("--batch-size", type=POSITIVE_INT, default=16, help="replies sampled at once")
    parser.add_argument("--replies-per-prompt", type=POSITIVE_INT, default=2, help="replies sampled per prompt; "
                        "every two of them can make a pair")
    parser.add_argument("--min-margin", type=Checked(float, NON_NEGATIVE), default=0.0,
                        help="keep a pair only when the gold scores differ by more than this")
    parser.add_argument("--dtype", choices=DTYPE_NAMES, default="auto",
                        help="the sampler's weights (auto: bfloat16 where the CPU has it natively)")
    parser.add_argument("--length-balance", choices=LENGTH_BALANCES, default="none",
                        help="similar: keep pairs whose replies differ by <= --length-tolerance tokens; half: a seeded "
                             "subsample where the longer reply is chosen in exactly half of the pairs")
    parser.add_argument("--length-tolerance", type=Checked(int, Bounds(low=0)), default=LENGTH_TOLERANCE,
                        help="tokens, for --length-balance similar")


def run(args: argparse.Namespace) -> int:
    info = make_pairs(
        args.prompts, args.out, args.model, args.judge, args.reply_cap, args.temperature, args.seed, args.batch_size,
        args.replies_per_prompt, args.min_margin, args.dtype, args.length_balance, args.length_tolerance,
    )
    print(f"wrote {args.out}; {summary_line(info)}")
    return 0
