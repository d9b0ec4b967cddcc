"""Is the proxy more than a length detector? The held-out numbers that say so, and the length term it trains against.

Singhal et al. (2024): a reward model trained on pairs whose chosen reply is more often the longer one can rank pairs
well by length alone. Four held-out numbers tell a proxy from a length detector:

    accuracy                every held-out pair
    similar-length accuracy the pairs whose replies differ by at most `tolerance` tokens: length carries no signal
    shorter-chosen accuracy the pairs whose chosen reply is the shorter one: length gets every one of them wrong
                            (and longer-chosen accuracy, its complement; a length detector scores ~1 there)
    reply-length corr       Pearson correlation of the proxy's score with the reply's length in tokens, per distinct
                            held-out reply
    RM - words              the paired difference in accuracy to the word-count baseline (word_baseline.py) on the
                            same pairs, with a 95% interval that resamples prompts (a prompt's pairs share replies)

The length term (reward_model.py --length-head, a product of experts as in ODIN, Chen et al. 2024): during training
the Bradley-Terry logit is r(chosen) - r(rejected) + w * gap / scale, gap the chosen reply's length minus the
rejected one's in tokens and scale the training gaps' standard deviation, w one learned scalar. What length explains
the w term takes, so the score head is pushed to explain only the rest; the term is dropped at scoring time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ppo_rlhf.study.stats import bootstrap_mean, paired_bootstrap, pearson


def cluster_ids(prompts: Sequence[str]) -> list[int]:
    """One integer per distinct prompt, in order of first appearance: the clusters a prompt bootstrap resamples."""
    index: dict[str, int] = {}
    return [index.setdefault(p, len(index)) for p in prompts]


def paired_difference(correct: Sequence[bool], other: Sequence[bool], prompts: Sequence[str],
                      seed: int = 0) -> tuple[float, float, float]:
    """Accuracy of `correct` minus accuracy of `other` on the same pairs: mean and 95% interval, prompts resampled."""
    diffs = [int(a) - int(b) for a, b in zip(correct, other, strict=True)]
    return paired_bootstrap(diffs, cluster_ids(prompts), seed=seed)


def subset_accuracy(correct: Sequence[bool], keep: Sequence[bool], prompts: Sequence[str], seed: int = 0) -> dict:
    """{"pairs": n kept, "accuracy": [mean, lo, hi] or None when none is kept}, prompts resampled."""
    chosen = [(c, p) for c, p, k in zip(correct, prompts, keep, strict=True) if k]
    if not chosen:
        return {"pairs": 0, "accuracy": None}
    values, groups = [float(c) for c, _ in chosen], cluster_ids([p for _, p in chosen])
    return {"pairs": len(chosen), "accuracy": [round(x, 4) for x in bootstrap_mean(values, groups, seed=seed)]}


def length_report(margins: Sequence[float], gaps: Sequence[int], prompts: Sequence[str],
                  reply_scores: Sequence[float], reply_lengths: Sequence[int],
                  word_margins: Sequence[float] | None, tolerance: int, seed: int = 0) -> dict:
    """The module docstring's numbers for held-out pairs: each pair's margin r(chosen) - r(rejected), its length gap
    (tokens, chosen minus rejected) and prompt; each distinct reply's score and length; the word baseline's margin of
    each pair (None: no RM - words). A pair counts as right when its margin is > 0."""
    correct = [m > 0 for m in margins]
    corr = pearson(reply_lengths, reply_scores)
    report = {
        "all": subset_accuracy(correct, [True] * len(correct), prompts, seed),
        "similar_length": subset_accuracy(correct, [abs(g) <= tolerance for g in gaps], prompts, seed),
        "shorter_chosen": subset_accuracy(correct, [g < 0 for g in gaps], prompts, seed),
        "longer_chosen": subset_accuracy(correct, [g > 0 for g in gaps], prompts, seed),
        "tolerance": tolerance,
        "reply_length_corr": None if math.isnan(corr) else round(corr, 4),  # nan: constant lengths or scores
        "replies": len(reply_scores),
    }
    if word_margins is not None:
        words = [m > 0 for m in word_margins]
        report["words"] = subset_accuracy(words, [True] * len(words), prompts, seed)
        report["rm_minus_words"] = [round(x, 4) for x in paired_difference(correct, words, prompts, seed)]
    return report


def report_line(report: dict) -> str:
    """length_report in words, one line."""
    def accuracy(name: str) -> str:
        part = report[name]
        return "n/a" if part["accuracy"] is None else f"{part['accuracy'][0]:.2f} ({part['pairs']})"

    corr = report["reply_length_corr"]
    line = (f"similar-length (<= {report['tolerance']} tokens) accuracy {accuracy('similar_length')}, shorter-chosen "
            f"{accuracy('shorter_chosen')}, longer-chosen {accuracy('longer_chosen')}; score-reply length "
            f"correlation {'n/a' if corr is None else f'{corr:+.2f}'}")
    if "rm_minus_words" in report:
        mean, lo, hi = report["rm_minus_words"]
        line += f"; RM - word counts {mean:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    return line


def length_scale(gaps: Sequence[int]) -> float:
    """The length term's unit: the root mean square of the training pairs' length gaps (1 when all are 0), so w is in
    logits per typical gap whatever the reply lengths."""
    mean_square = sum(g * g for g in gaps) / max(1, len(gaps))
    return math.sqrt(mean_square) if mean_square > 0 else 1.0


def length_fit(x: Sequence[float], iterations: int = 25, bound: float = 10.0) -> float:
    """The w maximising sum log sigmoid(w * x_i): how much length alone says that the chosen reply wins (a
    logistic regression with no intercept on the scaled gaps). The length term starts here, so from the first step
    the score head is trained on what length does not explain. Newton's method from 0; |w| <= bound, which it
    reaches when length separates the pairs."""
    w = 0.0
    for _ in range(iterations):
        grad = hess = 0.0
        for value in x:
            p = 1.0 / (1.0 + math.exp(-w * value))  # sigmoid(w x), |w x| stays small enough: w is bounded
            grad += value * (1.0 - p)
            hess += value * value * p * (1.0 - p)
        if hess <= 1e-12:
            break
        w = max(-bound, min(bound, w + grad / hess))
    return w
