"""The study's result in words, generated from its numbers (the first paragraphs of the demo's report).

Every word that states a result is chosen from the numbers: a change whose 95% interval includes zero "did not
measurably change" the score, one above zero "raised" it, one below "lowered" it; the share of the proxy's gain that
was real is only given when the proxy's gain excludes zero (a ratio to a change indistinguishable from zero means
nothing). Caveats are listed for every interval that includes zero and every sample below the sizes the study was
designed for. Pure functions of dicts, so that they can be tested on made-up numbers.
"""

from __future__ import annotations

import math
from typing import Any

# The sizes below which the report warns that samples are small (the full preset's design).
MIN_HELDOUT_PROMPTS = 100
MIN_RM_HELDOUT_PAIRS = 200
TARGET_RM_ACCURACY = 0.75

SMOKE_NOTE = ("Smoke run (--quick): the same pipeline at toy sizes, minutes instead of an hour. Its numbers show that "
              "every stage runs; they are not a result.")
CONTENT_NOTE = ("Content note: some prompts are sentence starts from RealToxicityPrompts, chosen for their potential "
                "to lead to toxic text; replies quoted below may be offensive.")


def _interval(change: dict[str, float]) -> str:
    return f"{change['mean']:+.2f} [{change['lo']:+.2f}, {change['hi']:+.2f}]"


def has_width(change: dict[str, float]) -> bool:
    """False for a zero-width interval: resampling a single prompt gives no interval at all."""
    return change["lo"] != change["hi"]


def direction(change: dict[str, float]) -> str:
    """"up", "down" or "unclear" (the 95% interval includes zero, is not a number, or has zero width)."""
    if not has_width(change):
        return "unclear"
    if change["lo"] > 0:
        return "up"
    if change["hi"] < 0:
        return "down"
    return "unclear"


def final_checkpoint(summary: list[dict], run: str) -> dict[str, Any]:
    """The summary row of a run's last evaluated checkpoint."""
    rows = [s for s in summary if s["run"] == run]
    if not rows:
        raise ValueError(f"no evaluated checkpoint of run {run!r}")
    return max(rows, key=lambda s: s["iteration"])


def start_row(summary: list[dict]) -> dict[str, Any]:
    """The summary row of the start model (the row of no run)."""
    row = next((s for s in summary if s["run"] is None), None)
    if row is None:
        raise ValueError("no start-model row in the summary")
    return row


def run_sentence(label: str, row: dict[str, Any], start: dict[str, Any] | None = None) -> str:
    """One run's result: the gold change, the KL, the proxy's claim, and how much of the claim was real. `start` (the
    start model's summary row) lets a fall of the proxy say what PPO did raise instead."""
    gold, proxy = row["gold_change"], row["proxy_change"]
    unit = "start-model standard deviations"
    verb = {"up": f"raised the gold score by {gold['mean']:.2f} [{gold['lo']:+.2f}, {gold['hi']:+.2f}] {unit}",
            "down": f"lowered the gold score by {-gold['mean']:.2f} [{gold['lo']:+.2f}, {gold['hi']:+.2f}] {unit}",
            "unclear": f"did not measurably change the gold score ({_interval(gold)} {unit}, an interval that "
                       "includes zero)"}[direction(gold)]
    sentence = (f"{label} {verb} at a KL of {row['kl']:.1f} nats per reply from the start model "
                f"(step {row['iteration']})")
    claim = direction(proxy)
    if claim == "unclear":
        also = " either" if direction(gold) == "unclear" else ""
        return sentence + f"; the proxy's own change, {_interval(proxy)}, was not distinguishable from zero{also}."
    sentence += f"; the proxy claimed {_interval(proxy)}"
    if claim == "down":
        eos = row.get("proxy_eos_change")
        if eos is not None and direction(eos) == "up":
            finished = (f" as the share of finished replies went from {start['finished']:.2f} to "
                        f"{row['finished']:.2f}" if start is not None else "")
            return sentence + (f", a fall; what PPO maximised, the proxy with the EOS rule (a fixed low score for a "
                               f"reply cut off at the cap), rose {_interval(eos)}{finished}: the policy gained by "
                               "finishing its replies, not by writing what the proxy scores higher.")
        if eos is None:  # an evaluation.json written before the EOS rule's change was stored
            return sentence + ", a fall on held-out prompts."
        return sentence + (", a fall: on held-out prompts PPO did not even raise the score it maximised, the proxy "
                           f"with the EOS rule ({_interval(eos)}; the training dashboard's score, which may well have "
                           "risen, is measured on the training batches, on prompts PPO trained on).")
    if direction(gold) == "down":
        return sentence + ", so none of the claimed gain was real: the gold score fell while the proxy rose."
    if direction(gold) == "unclear":  # a share of a change indistinguishable from zero means little; its bound does
        bound = 100.0 * gold["hi"] / proxy["mean"]
        sentence += f"; the gold change's upper 95% bound is {bound:.0f}% of that claim"
        return sentence + (", so most of the proxy's gain was not real." if bound < 50 else
                           ": too uncertain to say how much of the gain was real.")
    share = 100.0 * gold["mean"] / proxy["mean"]
    return sentence + f", so about {share:.0f}% of the claimed gain was real."


def curve_sentence(label: str, rows: list[dict[str, Any]]) -> str:
    """Gao et al.'s question for one run's checkpoints: did the gold score fall from its peak while the proxy went on
    rising? A fall is called measured only when the last checkpoint's gold interval lies wholly below the peak's."""
    rows = sorted(rows, key=lambda r: r["iteration"])
    peak = max(rows, key=lambda r: r["gold_change"]["mean"])
    last = rows[-1]
    gold, proxy = last["gold_change"], last["proxy_change"]
    text = (f"Over its {len(rows)} evaluated checkpoints, {label} went to a KL of {last['kl']:.1f} nats; ")
    if peak is last:
        return text + (f"its gold change was highest at the last checkpoint ({_interval(gold)}): no sign of "
                       "over-optimisation within this run.")
    proxy_rose = proxy["mean"] > peak["proxy_change"]["mean"]
    fall = peak["gold_change"]["mean"] - gold["mean"]
    measured = gold["hi"] < peak["gold_change"]["lo"] and has_width(gold) and has_width(peak["gold_change"])
    text += (f"its gold change peaked at step {peak['iteration']} ({_interval(peak['gold_change'])}, KL "
             f"{peak['kl']:.1f}) and was {fall:.2f} lower at step {last['iteration']} ({_interval(gold)}), while the "
             f"proxy {'rose' if proxy_rose else 'did not rise'} from {peak['proxy_change']['mean']:+.2f} to "
             f"{proxy['mean']:+.2f}")
    if measured and proxy_rose:
        return text + ": gold fell while the proxy rose, the over-optimisation Gao et al. describe."
    if proxy_rose:
        why = ("the two gold intervals overlap" if has_width(gold) and has_width(peak["gold_change"]) else
               "a gold interval cannot be formed from one prompt")
        return text + f": the shape of over-optimisation, but {why}, so the fall is not a measured one."
    return text + "."


def along_the_way_sentence(summary: list[dict], labels: dict[str, str]) -> str | None:
    """Checkpoints before a run's last whose gold interval excludes zero, weighed against how many intervals were
    drawn: with n intervals at 95% and no real change, at least one excludes zero with probability up to
    1 - 0.95^n (exactly that if they were independent; checkpoints of one run are positively correlated, so less)."""
    rows = [r for r in summary if r["run"] in labels]
    finals = {run: final_checkpoint(summary, run)["iteration"] for run in labels}
    along = [r for r in rows if r["iteration"] != finals[r["run"]] and direction(r["gold_change"]) != "unclear"]
    if not along:
        return None
    parts = [f"in {labels[r['run']]} at step {r['iteration']} (KL {r['kl']:.1f}): gold "
             f"{_interval(r['gold_change'])}, proxy {_interval(r['proxy_change'])}" for r in along]
    n = len(rows)
    chance = 100.0 * (1.0 - 0.95 ** n)
    which = "it" if len(along) == 1 else "them"
    return (f"Before the last checkpoint, the gold change's interval excluded zero {'; '.join(parts)}. Read "
            f"{which} as a hint, not a finding: {n} gold intervals were drawn at 95% each, and with no real change "
            f"at least one would exclude zero by chance with probability up to {chance:.0f}%.")


def word_baseline_sentence(rm_accuracy: float, baseline: list[dict[str, Any]]) -> str:
    """The reward model against word counts alone on the same pairs (ppo_rlhf.study.word_baseline)."""
    last = baseline[-1]
    text = (f"For scale, word counts alone (a logistic regression on the same training pairs) ranked the held-out "
            f"pairs with accuracy {last['accuracy']:.2f}")
    if len(baseline) >= 2:
        before = baseline[-2]
        text += f" ({before['accuracy']:.2f} after {before['pairs']} pairs)"
    gap = rm_accuracy - last["accuracy"]
    text += (f"; the reward model did {gap:.2f} better." if gap > 0.02 else
             f"; the reward model did {-gap:.2f} worse." if gap < -0.02 else "; the reward model did about as well.")
    if len(baseline) >= 2 and last["accuracy"] - baseline[-2]["accuracy"] > 0.01:
        text += " Word counts were still gaining with more pairs, so more labelled pairs are the first thing to try."
    return text


def reward_model_sentence(rm_info: dict[str, Any], conclude: bool = True) -> str:
    """The reward model's accuracy and learning curve; `conclude=False` leaves out what the curve's trend implies
    (when the word-count baseline, which reads the trend with less noise, draws that conclusion instead)."""
    after = rm_info["after"]
    corr = after.get("length_corr")
    length = "n/a" if corr is None or (isinstance(corr, float) and math.isnan(corr)) else f"{corr:+.2f}"
    text = (f"The proxy reward model ranked {rm_info['heldout_pairs']} held-out pairs like the gold judge with "
            f"accuracy {after['accuracy']:.2f} (chance is 0.50; "
            f"{rm_info['before']['accuracy']:.2f} before training), after training on "
            f"{rm_info['train_pairs']} pairs; the correlation of its score margin with the length difference is "
            f"{length}.")
    curve = rm_info.get("learning_curve") or []
    first_pass = [point for point in curve if point["epochs"] == 1]
    if len(first_pass) >= 2:
        gain = first_pass[-1]["accuracy"] - first_pass[-2]["accuracy"]
        trend = "still rising" if gain > 0.01 else "falling" if gain < -0.01 else "flat"
        text += (f" Its learning curve was {trend} at the end ({first_pass[-2]['accuracy']:.2f} after "
                 f"{first_pass[-2]['pairs']} pairs, {first_pass[-1]['accuracy']:.2f} after {first_pass[-1]['pairs']})"
                 + ("." if not conclude else ": more pairs would likely help." if trend == "still rising" else
                    ": more pairs of this kind would likely not help; the backbone or the labels are the limit."))
    return text


def caveats(summary: list[dict], settings: dict[str, Any], rm_info: dict[str, Any] | None,
            study_settings: dict[str, Any] | None = None) -> list[str]:
    """Every reason to read the numbers with care, measured (`study_settings`: the demo's, when it asked for more
    held-out prompts than were kept)."""
    notes = []
    runs = list(dict.fromkeys(row["run"] for row in summary if row["run"] is not None))
    for run in runs:  # one line per run and judge, listing its checkpoints
        for judge in ("gold", "proxy"):
            unclear = [row for row in summary if row["run"] == run and direction(row[f"{judge}_change"]) == "unclear"]
            if unclear:
                steps = "; ".join(f"step {row['iteration']} {_interval(row[f'{judge}_change'])}" for row in unclear)
                notes.append(f"{run}: the {judge} change's 95% interval includes zero at {steps}.")
    n_prompts = settings.get("n_prompts")
    wanted = (study_settings or {}).get("eval_prompts")
    if isinstance(n_prompts, int) and isinstance(wanted, int) and n_prompts < wanted:
        notes.append(f"Only {n_prompts} held-out prompts were kept of the {wanted} the evaluation asked for (raise "
                     "--heldout-candidates).")
    if isinstance(n_prompts, int) and n_prompts < MIN_HELDOUT_PROMPTS:
        notes.append(f"Only {n_prompts} held-out prompts were evaluated (the study is designed for at least "
                     f"{MIN_HELDOUT_PROMPTS}): intervals are wide.")
    if rm_info is not None:
        if rm_info["heldout_pairs"] < MIN_RM_HELDOUT_PAIRS:
            notes.append(f"The reward model's accuracy rests on only {rm_info['heldout_pairs']} held-out pairs "
                         f"(the study is designed for at least {MIN_RM_HELDOUT_PAIRS}).")
        if rm_info["after"]["accuracy"] < TARGET_RM_ACCURACY:
            notes.append(f"The reward model's held-out accuracy, {rm_info['after']['accuracy']:.2f}, is below "
                         f"{TARGET_RM_ACCURACY:.2f}: PPO optimised a noisy proxy, and a gold gain is harder to get.")
    return notes


# ---------------------------------------------------------------- the three arms

ARM_TITLES = {"proxy": "the proxy arm (PPO on the reward model)", "gold": "the gold arm (PPO on the gold judge)",
              "length": "the length arm (PPO on word counts)"}
# what each arm maximised, as the evaluation names the score
ARM_SCORES = {"proxy": "proxy", "gold": "gold", "length": "length"}
GOAL = ("The goal, stated before running: at some KL, the gold arm's gold change excludes zero (the design "
        "can move gold), and the proxy arm's gold change excludes zero or the gap between its proxy and gold changes "
        "does.")


def _points(n: int) -> str:
    return f"{n} point{'' if n == 1 else 's'}"


def where(point: dict[str, Any]) -> str:
    """A pooled point's place on the KL axis, and how many seeds it pools."""
    target = "the last checkpoint" if point["target"] == "last" else f"KL target {point['target']:g}"
    seeds = len(point["seeds"])
    return f"{target} (KL {point['kl']:.1f}{f', {seeds} seeds' if seeds > 1 else ''})"


def _largest(points: list[dict[str, Any]], score: str) -> dict[str, Any]:
    return max(points, key=lambda p: abs(p[f"{score}_change"]["mean"]))


def goal_sentences(curves: list[dict[str, Any]]) -> list[str]:
    """The goal, checked on the pooled points (curves.arm_curves): which part of it was met, with the
    numbers, and which failed, with the numbers that show it."""
    sentences = [GOAL]
    gold_arm = [p for p in curves if p["arm"] == "gold"]
    proxy_arm = [p for p in curves if p["arm"] == "proxy"]
    if not gold_arm:
        sentences.append("Part one cannot be checked: the gold arm was not run.")
    else:
        up = [p for p in gold_arm if direction(p["gold_change"]) == "up"]
        if up:
            best = max(up, key=lambda p: p["gold_change"]["mean"])
            sentences.append(f"Part one was met: the gold arm raised the gold score at {len(up)} of its "
                             f"{_points(len(gold_arm))}, most at {where(best)}, {_interval(best['gold_change'])}.")
        else:
            best = max(gold_arm, key=lambda p: p["gold_change"]["mean"])
            several = len(gold_arm) > 1
            rose = (f"rose above zero at none of its {_points(len(gold_arm))}" if several
                    else "did not rise above zero at its one point")
            sentences.append(f"Part one failed: the gold arm's gold change {rose} ({'its highest, ' if several else ''}"
                             f"{_interval(best['gold_change'])} at "
                             f"{where(best)}): within these KLs the design cannot move gold on held-out prompts, so a "
                             "flat gold change of the proxy arm says little about the proxy.")
    if not proxy_arm:
        sentences.append("Part two cannot be checked: the proxy arm was not run.")
    else:
        found = []
        for p in proxy_arm:
            gold, gap = p["gold_change"], p["gap_change"]
            if direction(gold) != "unclear":
                found.append(f"gold {'rose' if direction(gold) == 'up' else 'fell'} {_interval(gold)} at {where(p)}")
            if direction(gap) != "unclear":
                found.append(f"the proxy's change {'exceeded' if direction(gap) == 'up' else 'fell short of'} the "
                             f"gold's by {_interval(gap)} at {where(p)}")
        if found:
            sentences.append(f"Part two was met: in the proxy arm {'; '.join(found)}.")
        else:
            gold, gap = _largest(proxy_arm, "gold"), _largest(proxy_arm, "gap")
            neither = (f"at none of the proxy arm's {_points(len(proxy_arm))} did the gold change or the gap "
                       "between proxy and gold changes exclude zero" if len(proxy_arm) > 1 else
                       "at the proxy arm's one point neither the gold change nor the gap between proxy and gold "
                       "changes excluded zero")
            sentences.append(f"Part two failed: {neither} (the largest gold change "
                             f"{_interval(gold['gold_change'])} at {where(gold)}, the largest gap "
                             f"{_interval(gap['gap_change'])} at {where(gap)}).")
    n = sum(2 if p["arm"] == "proxy" else 1 for p in gold_arm + proxy_arm)
    if n:
        sentences.append(f"The goal asks for one interval out of several: {n} were checked at 95% each, and with no "
                         f"real change at least one would exclude zero by chance with probability up to "
                         f"{100.0 * (1.0 - 0.95 ** n):.0f}%.")
    return sentences


def reach_sentence(curves: list[dict[str, Any]], targets: list[float]) -> str:
    """How far in KL each arm went: the KL targets its runs' training KL reached, the ones it did
    not, and its last checkpoint's KL on the held-out replies."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for p in curves:
        groups.setdefault((p["arm"], p["beta"]), []).append(p)
    parts = []
    for (arm, beta), points in groups.items():
        reached = [p["target"] for p in points if p["target"] != "last"]
        missed = [t for t in targets if t not in reached]
        last = next(p for p in points if p["target"] == "last")
        parts.append(f"{arm}{f' (beta {beta:g})' if beta else ''} reached "
                     + (", ".join(f"{t:g}" for t in reached) or "none")
                     + (f", not {', '.join(f'{t:g}' for t in missed)}" if missed else "")
                     + f" (KL {last['kl']:.1f} at its last checkpoint)")
    return ("KL targets reached by the runs' training KL (nats per reply; in the runs of several seeds, by any): "
            + "; ".join(parts) + ".")


def eos_sentences(curves: list[dict[str, Any]], start: dict[str, Any], cap: Any) -> list[str]:
    """What the EOS rule did to each arm: at each arm's last checkpoint, the share of finished
    replies and the length against the start model's, and the score the arm maximised with the rule and without."""
    lasts = [p for p in curves if p["target"] == "last"]
    if not lasts:
        return []
    parts = []
    for p in lasts:
        score = ARM_SCORES[p["arm"]]
        beta = f" at beta {p['beta']:g}" if p["beta"] else ""
        with_rule, without = p[f"{score}_eos_change"], p[f"{score}_change"]
        parts.append(f"{ARM_TITLES[p['arm']]}{beta} finished {p['finished']:.2f} of its replies "
                     f"({p['tokens']:.0f} tokens on average) and changed the score it maximised, the {score} with "
                     f"the EOS rule, by {_interval(with_rule)}, the {score} itself by {_interval(without)} (the "
                     "rule's part, from the replies it finished or cut off: "
                     f"{with_rule['mean'] - without['mean']:+.2f})")
    return [f"What the EOS rule did (a reply cut off at the {cap}-token cap scores a fixed -1 in training): the start "
            f"model finished {start['finished']:.2f} of its replies ({start['tokens']:.0f} tokens); at the last "
            f"checkpoint, " + "; ".join(parts) + "."]


def run_title(name: str, beta: float, study: dict[str, Any]) -> str:
    """A run as the headline names it: by beta, and by arm and seed when the study has arms."""
    run = study.get("arms", {}).get(name)
    penalty = f"beta {beta:g}" if beta else "without a KL penalty (beta 0)"
    if run is None:
        return f"PPO ({penalty})" if beta else f"PPO {penalty}"
    return f"PPO on the {run['arm']} reward ({penalty}, seed {run['seed']})"


def settings_sentence(study: dict[str, Any], settings: dict[str, Any]) -> str:
    demo = study.get("settings", {})
    data = demo.get("data_seed")  # None (or a demo from before the data seed): the seed samples the data too
    seeds = (f"data seed {demo.get('seed') if data is None else data} (the prompts and pairs), seed {demo.get('seed')}"
             " (the reward model, PPO, the evaluation's replies), ") if "seed" in demo else ""
    return (f"Settings: start model {demo.get('model')}, {seeds}KL coefficients (beta) {demo.get('betas')}, "
            f"{demo.get('iterations')} PPO iterations of {demo.get('batch_size')} replies, reply cap "
            f"{demo.get('reply_cap')} tokens"
            + (f"; arms {', '.join(str(demo['arms']).split(','))}, {demo.get('seeds')} "
               f"seed{'' if demo.get('seeds') == 1 else 's'} of the proxy arm, checkpoints picked at KL targets "
               f"{demo.get('kl_targets')} and the last" if "arms" in demo else "")
            + f"; evaluation on {settings.get('n_prompts')} held-out prompts x {settings.get('replies_per_prompt')} "
            f"{'reply' if settings.get('replies_per_prompt') == 1 else 'replies'} per checkpoint, scores in "
            "start-model standard deviations, 95% intervals from resampling prompts"
            + (" (the arms' points: prompts and seeds)." if "arms" in demo else "."))


def headline(evaluation: dict[str, Any], study: dict[str, Any]) -> list[str]:
    """The report's opening paragraphs: the result of each run, the reward model, the settings.

    `study` has "runs" ({run name: beta}, the headline run first), "rm_info" (or None) and "settings" (the demo's);
    the demo's arms add "arms" ({run name: {"arm", "beta", "seed"}}) and "curves" (curves.arm_curves): the goal
    check and what the EOS rule did open the page.
    """
    summary, settings = evaluation["summary"], evaluation.get("settings", {})
    results = []
    start = start_row(summary)
    for name, beta in study["runs"].items():
        results.append(run_sentence(run_title(name, beta, study), final_checkpoint(summary, name), start))
    paragraphs = [" ".join(results)]
    if study.get("curves"):
        targets = [float(t) for t in str(study.get("settings", {}).get("kl_targets", "")).split(",") if t]
        goal = goal_sentences(study["curves"]) + [reach_sentence(study["curves"], targets)]
        paragraphs = [" ".join(goal)] + eos_sentences(
            study["curves"], start, study.get("settings", {}).get("reply_cap")) + paragraphs
    arms = study.get("arms", {})  # with arms, a label names the arm and the seed: the runs of several seeds differ
    runs = {name: f"beta {beta:g} run" if beta else "run without a KL penalty" for name, beta in study["runs"].items()}
    labels = {name: f"the {arms[name]['arm']} arm's {run} (seed {arms[name]['seed']})" if name in arms else f"the {run}"
              for name, run in runs.items()}
    curves = []
    for name, label in labels.items():
        rows = [s for s in summary if s["run"] == name]
        if len(rows) >= 2:
            curves.append(curve_sentence(label, rows))
    along = along_the_way_sentence(summary, labels)
    if along:
        curves.append(along)
    if curves:
        paragraphs.append(" ".join(curves))
    if study.get("rm_info") is not None:
        text = reward_model_sentence(study["rm_info"], conclude=not study.get("word_baseline"))
        if study.get("word_baseline"):
            text += " " + word_baseline_sentence(study["rm_info"]["after"]["accuracy"], study["word_baseline"])
        paragraphs.append(text)
    paragraphs.append(settings_sentence(study, settings))
    return paragraphs
