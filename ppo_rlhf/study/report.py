"""Plots and a report page for training runs and an evaluation (`ppo-rlhf report`).

From each RUN_DIR/history.jsonl: the dashboard of spec 8.9/8.11 over iterations, one line per run, and a table
of its averages over the first and the last five iterations (as in spec 8.10). From EVAL_DIR/evaluation.json
(`ppo-rlhf evaluate`): gold and proxy change against KL to the start model, the over-optimisation picture of
Gao et al. (2022), the summary table and the before/after examples. The page is written twice from the same
blocks: report.md (next to the PNGs) and report.html (self-contained, images inline).
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.ppo.dashboard import DASHBOARD
from ppo_rlhf.study.evaluate import length_correlation, shown_reply

if TYPE_CHECKING:  # matplotlib is imported by the functions that draw: `ppo-rlhf report --help` answers without it
    from matplotlib.figure import Figure

EDGE_ITERATIONS = 5  # "first five and last five iterations"

# A page is a list of blocks, rendered to Markdown and to HTML:
# ("h2", text) | ("p", text) | ("table", header, rows) | ("img", file name, caption) | ("pre", text)
Block = tuple


# ---------------------------------------------------------------- reading


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    """The per-iteration dashboard dicts of a run (NaN allowed, as dashboard.history_line writes them)."""
    run_dir = Path(run_dir)
    require(not run_dir.is_file(), f"{run_dir} is a file, not a run directory")
    require(run_dir.is_dir(), f"run directory {run_dir} not found")
    path = run_dir / "history.jsonl"
    require(path.is_file(), f"{run_dir} has no history.jsonl")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            raise UsageError(f"{path}:{number}: not valid JSON") from None
    require(bool(rows), f"{path} is empty")
    return rows


def machine_sentence(run_dirs: list[Path]) -> str | None:
    """What each run's settings resolved to on its machine (run_info.json, written by `train` at its latest start):
    "ppo: dtype auto -> float32 (no AVX512-BF16/AMX-BF16 on this CPU), 2 threads, device cpu"; None if no run has it."""
    parts = []
    for run_dir in run_dirs:
        try:
            info = json.loads((run_dir / "run_info.json").read_text())
            threads = f"{info['threads']} thread{'s' if info['threads'] != 1 else ''}"
            parts.append(f"{run_dir.resolve().name}: dtype {info['dtype_note']}, {threads}, device {info['device']}")
        except (OSError, ValueError, KeyError, TypeError):  # older runs have none; the report does not need it
            continue
    return "Run settings on their machine: " + "; ".join(parts) + "." if parts else None


def read_evaluation(eval_dir: Path) -> dict[str, Any]:
    path = Path(eval_dir) / "evaluation.json"
    require(path.is_file(), f"{path} not found (write it with ppo-rlhf evaluate --out {eval_dir})")
    try:
        evaluation = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise UsageError(f"{path}: not valid JSON") from None
    is_evaluation = isinstance(evaluation, dict) and "summary" in evaluation
    require(is_evaluation, f"{path} has no summary; is it from ppo-rlhf evaluate?")
    # every change in it is paired with the start model's replies: the page cannot be drawn without its row
    has_start = isinstance(evaluation["summary"], list) and any(
        isinstance(s, dict) and s.get("run", "") is None for s in evaluation["summary"])
    require(has_start, f"{path} has no start-model row in its summary; is it from ppo-rlhf evaluate?")
    return evaluation


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


# ---------------------------------------------------------------- plots


# What each dashboard number is, in words, and its unit (the y-axis label); keys as in dashboard.DASHBOARD.
PANELS: dict[str, tuple[str, str]] = {
    "score": ("Reward score (normalised, EOS rule)", "start-policy sd"),
    # each run's own reward (proxy, gold judge, word counts): units that differ between arms (a word count is ~40,
    # a reward model's score ~1), so the panel shows each run's change since its first iteration
    "rm_raw": ("Raw reward, change from iteration 0", "the run's own reward's units"),
    "kl": ("KL from the reference policy", "nats per reply"),
    "len": ("Reply length", "tokens"),
    "fin": ("Replies that ended with EOS", "share of replies"),
    "ent": ("Policy entropy", "nats per token"),
    "clipfrac": ("Tokens with the policy ratio clipped", "share of tokens"),
    "approx_kl": ("Policy change per update", "approx. KL, nats per token"),
    "v_loss": ("Value model loss", "(score sd)²"),
    # below 0 whenever the value model predicts worse than a constant would, as an untrained one does
    "ev": ("Value model: explained variance", "1 = perfect, 0 = no better than\nthe mean, below 0 = worse"),
    "vclipfrac": ("Tokens with the value update clipped", "share of tokens"),
}

# Lines of different runs can coincide (the same seed gives the same first iterations): each run gets its own
# hollow marker and dash pattern, so that every run stays visible under the others and in the legend.
MARKERS = ("o", "s", "^", "D", "v", "P")
LINESTYLES = ("-", "--", ":", "-.")


def run_style(k: int) -> dict[str, Any]:
    return {"marker": MARKERS[k % len(MARKERS)], "linestyle": LINESTYLES[k % len(LINESTYLES)],
            "markerfacecolor": "none", "markersize": 5 + 2 * (k % 3)}


# The reward-hacking monitor's panels after the dashboard's (ppo/monitor.py): key: (title, y-axis label); then one panel
# per monitor judge (`monitor/<name>`), or one saying there is none.
MONITOR_PANELS: dict[str, tuple[str, str]] = {
    "reward_length_corr": ("Reward hacking? corr(reward, length) [len_r]", "Pearson r over the batch"),
    "length_share": ("Hacking? gain due to length [length_share]", "share of the reward gain (1 = all)"),
}
JUDGE_PANEL = ("Judge flat while rm_raw rises = hacking", "mean score (the judge's units)")


def _iterations(history: list[dict]) -> list[int]:
    return [row.get("iteration", i) for i, row in enumerate(history)]


def figure_panels(histories: dict[str, list[dict]]) -> list[tuple[str, str, str, str]]:
    """(history key, title, y-axis label, what an empty panel says) of every panel of the dashboard figure."""
    panels = [(key, f"{PANELS[key][0]} [{label}]", PANELS[key][1], "not logged by these runs")
              for key, label, _ in DASHBOARD]
    panels += [(key, title, unit, "not logged by these runs") for key, (title, unit) in MONITOR_PANELS.items()]
    judges = sorted({key for history in histories.values() for row in history for key in row
                     if key.startswith("monitor/")})
    title, unit = JUDGE_PANEL
    # the judge's key on a line of its own: "monitor/<name>" is long, and one line was cut off at the panel's edge
    panels += [(key, f"{title}\n[{key}]", unit, "not logged by these runs") for key in judges] or \
        [("monitor/", title, unit, "no monitor_judges in these runs")]
    return panels


def dashboard_figure(histories: dict[str, list[dict]]) -> Figure:
    """One panel per dashboard number, then the reward-hacking monitor's (`figure_panels`); iterations on x, one line
    per run, every panel over all the runs' iterations (a number first measured in the last one is one point, which
    would otherwise get an x-axis of its own, a few hundredths wide); the legend of the runs above the panels."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    panels = figure_panels(histories)
    columns = 3  # panels wide enough to read at the page's width
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(4.2 * columns, 3.2 * rows + 0.6), layout="constrained")  # + the legend's strip
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    iterations = [i for history in histories.values() for i in _iterations(history)]
    first, last = min(iterations), max(iterations)
    margin = max(0.5, 0.05 * (last - first))  # half an iteration either side of a run of one iteration
    for axis, (key, title, unit, empty) in zip(axes, panels):
        logged = False
        for k, (name, history) in enumerate(histories.items()):
            y = [_number(row.get(key)) for row in history]
            if key == "rm_raw":
                y = [v - next((u for u in y if not math.isnan(u)), math.nan) for v in y]
            logged |= not all(math.isnan(v) for v in y)
            axis.plot(_iterations(history), y, label=name, **run_style(k))
        if not logged:  # e.g. the value model's numbers of critic-free runs: say so rather than leave a blank panel
            axis.text(0.5, 0.5, empty, transform=axis.transAxes, ha="center", va="center")
            axis.set_yticks([])
        axis.set_xlim(first - margin, last + margin)
        axis.set_title(title, fontsize=10)
        axis.set_ylabel(unit)
        axis.set_xlabel("iteration")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # 1: a run of one iteration too
        axis.ticklabel_format(axis="y", useOffset=False)  # "+5.689" above the axis is easy to miss: full numbers
        axis.grid(alpha=0.3)
    for axis in axes[len(panels) :]:
        axis.set_axis_off()
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside upper center", ncols=min(len(labels), 4), title="run", fontsize=11,
                  title_fontsize=11)
    return figure


JUDGE_TITLES = {
    "gold": "Gold judge (not trained on): change from the start model",
    "proxy": "Proxy (the reward model PPO maximised): change from the start model",
}


def overoptimisation_figure(summary: list[dict]) -> Figure:
    """Gold and proxy change (95% bootstrap intervals over prompts) against KL to the start model, one series per
    run, each point labelled with its iteration.

    Every series starts at the start model, (0, 0): Gao et al.'s picture is gold rising with KL and then
    falling while the proxy keeps rising. The two panels share both axes, so that the gap between what the proxy
    claimed and what the gold judge saw reads off at any KL.
    """
    from matplotlib.figure import Figure

    from ppo_rlhf.study.findings import start_row

    start = start_row(summary)
    runs: dict[str, list[dict]] = {}
    for s in summary:
        if s["run"] is not None:
            runs.setdefault(s["run"], []).append(s)
    figure = Figure(figsize=(12, 4.6), layout="constrained")
    axes = figure.subplots(1, 2, sharex=True, sharey=True)
    for axis, judge in zip(axes, ("gold", "proxy")):
        for k, (name, points) in enumerate(runs.items()):
            points = [start] + sorted(points, key=lambda s: s["iteration"])
            changes = [s[f"{judge}_change"] for s in points]
            means = [c["mean"] for c in changes]
            errors = [[m - c["lo"] for m, c in zip(means, changes)], [c["hi"] - m for m, c in zip(means, changes)]]
            kls = [s["kl"] for s in points]
            axis.errorbar(kls, means, yerr=errors, capsize=3, label=name, **run_style(k))
            for s, x, y in zip(points[1:], kls[1:], means[1:]):
                axis.annotate(f"it {s['iteration']}", (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
        axis.annotate("start model", (start["kl"], 0.0), textcoords="offset points", xytext=(5, -12), fontsize=8)
        dress_change_axis(axis, judge, "KL to the start model (nats per reply)", "run (bars: 95% interval)")
    axes[1].yaxis.set_tick_params(labelleft=True)  # shared, but each panel keeps its numbers
    return figure


def dress_change_axis(axis, judge: str, xlabel: str, legend_title: str) -> None:
    """A score-change-against-KL panel's zero line, labels, title, grid and legend (both KL figures)."""
    axis.axhline(0.0, color="grey", linewidth=0.8)
    axis.set_xlabel(xlabel)
    axis.set_ylabel("score change (start-model sd)")
    axis.set_title(JUDGE_TITLES[judge], fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(title=legend_title, fontsize=9, title_fontsize=9)


ARM_COLOURS = {"proxy": "tab:blue", "gold": "tab:orange", "length": "tab:green"}
ARM_LEGEND = {"proxy": "PPO on the proxy reward model", "gold": "PPO on the gold judge itself",
              "length": "PPO on word counts (length detector)"}


def arms_figure(curves: list[dict], start_kl: float) -> Figure:
    """Gold change and proxy change against KL for every arm (one line per arm and beta, from the start model at
    (0, 0)), with 95% bands pooled over prompts and seeds (curves.arm_curves)."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.8), layout="constrained")
    axes = figure.subplots(1, 2, sharex=True, sharey=True)
    groups: dict[tuple[str, float], list[dict]] = {}
    for point in curves:
        groups.setdefault((point["arm"], point["beta"]), []).append(point)
    for axis, judge in zip(axes, ("gold", "proxy")):
        for k, ((arm, beta), points) in enumerate(groups.items()):
            points = sorted(points, key=lambda p: p["kl"])
            kls = [start_kl] + [p["kl"] for p in points]
            changes = [{"mean": 0.0, "lo": 0.0, "hi": 0.0}] + [p[f"{judge}_change"] for p in points]
            label = ARM_LEGEND[arm] + (f", beta {beta:g}" if beta else "")
            style = {"color": ARM_COLOURS[arm], "linestyle": LINESTYLES[k % len(LINESTYLES)]}
            axis.plot(kls, [c["mean"] for c in changes], marker="o", label=label, **style)
            axis.fill_between(kls, [c["lo"] for c in changes], [c["hi"] for c in changes], alpha=0.15,
                              color=ARM_COLOURS[arm])
        dress_change_axis(axis, judge, "KL to the start model (nats per reply, held-out replies)",
                          "arm (bands: 95% over prompts and seeds)")
    axes[1].yaxis.set_tick_params(labelleft=True)
    return figure


def seeds_figure(summary: list[dict], runs: list[str]) -> Figure:
    """Gold and proxy change against KL for each seed's run of the main arm, from the start model at (0, 0) through
    every evaluated checkpoint (bars: 95% over that seed's prompts): how far the seeds agree. (Without the start a
    seed with one checkpoint past its first KL target was a lone point, where the other figures draw a line.)"""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(12, 4.6), layout="constrained")
    axes = figure.subplots(1, 2, sharex=True, sharey=True)
    for axis, judge in zip(axes, ("gold", "proxy")):
        for k, name in enumerate(runs):
            points = sorted((s for s in summary if s["run"] == name), key=lambda s: s["kl"])
            changes = [{"mean": 0.0, "lo": 0.0, "hi": 0.0}] + [s[f"{judge}_change"] for s in points]  # the start
            means = [c["mean"] for c in changes]
            errors = [[m - c["lo"] for m, c in zip(means, changes)], [c["hi"] - m for m, c in zip(means, changes)]]
            axis.errorbar([0.0] + [s["kl"] for s in points], means, yerr=errors, capsize=3, label=name,
                          **run_style(k))
        axis.axhline(0.0, color="grey", linewidth=0.8)
        axis.set_xlabel("KL to the start model (nats per reply, held-out replies)")
        axis.set_ylabel("score change (start-model sd)")
        axis.set_title(JUDGE_TITLES[judge] + "\n(one line per seed)", fontsize=10)
        axis.grid(alpha=0.3)
        axis.legend(title="run (bars: 95% over prompts)", fontsize=9, title_fontsize=9)
    axes[1].yaxis.set_tick_params(labelleft=True)
    return figure


def curves_table(curves: list[dict]) -> tuple[list[str], list[list[str]]]:
    header = ["arm", "beta", "KL target", "seeds", "KL", "gold change [95%]", "proxy change [95%]",
              "proxy - gold [95%]", "length change [95%]", "finished", "tokens"]

    def interval(c: dict) -> str:
        return f"{_fmt(c['mean'], '+.2f')} [{_fmt(c['lo'], '+.2f')}, {_fmt(c['hi'], '+.2f')}]"

    rows = [[p["arm"], f"{p['beta']:g}", str(p["target"]), ",".join(map(str, p["seeds"])), _fmt(p["kl"], ".2f"),
             interval(p["gold_change"]), interval(p["proxy_change"]), interval(p["gap_change"]),
             interval(p["length_change"]), _fmt(p["finished"], ".2f"), _fmt(p["tokens"], ".1f")] for p in curves]
    return header, rows


# each arm in the words of the arms section's heading and caption
ARM_BUYS = {"proxy": "the proxy", "gold": "the gold judge", "length": "word counts"}
ARM_ON = {"proxy": "on the proxy", "gold": "on the gold judge itself", "length": "on word counts"}


def _and(words: Iterable[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    words = list(words)
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def arms_blocks(curves: list[dict], evaluation: dict[str, Any], arms: dict[str, dict], out_dir: Path) -> list[Block]:
    """The arms' figure and table, and the main arm's per-seed figure."""
    from ppo_rlhf.study.arms import MAIN_ARM
    from ppo_rlhf.study.findings import start_row

    arms_figure(curves, start_row(evaluation["summary"])["kl"]).savefig(out_dir / "arms.png", dpi=100)
    ran = [arm for arm in ARM_COLOURS if any(point["arm"] == arm for point in curves)]  # a quick demo runs two
    count = {1: "One arm", 2: "Two arms", 3: "Three arms"}.get(len(ran), f"{len(ran)} arms")
    blocks: list[Block] = [
        ("h2", f"{count}: what {_and(ARM_BUYS[arm] for arm in ran)} {'buys' if len(ran) == 1 else 'each buy'} at "
               "each KL"),
        ("img", "arms.png", "gold change (left) and proxy change (right) against KL to the start model for PPO "
                            f"{_and(ARM_ON[arm] for arm in ran)}; each point is the first checkpoint past a KL target "
                            "(and the last), pooled over the seeds; bands: 95% intervals that resample prompts "
                            "(jointly for all seeds) and seeds"),
        ("table", *curves_table(curves)),
    ]
    main = [name for name, run in arms.items() if run["arm"] == MAIN_ARM]
    if len(main) > 1:  # "how far the seeds agree": one seed's figure would only repeat its points in arms.png
        seeds_figure(evaluation["summary"], main).savefig(out_dir / "seeds.png", dpi=100)
        blocks.append(("img", "seeds.png", "the proxy arm seed by seed: gold and proxy change against KL at every "
                                           "evaluated checkpoint (bars: 95% intervals over prompts)"))
    else:  # a page re-drawn in the same folder must not leave an earlier run's figure beside it
        (out_dir / "seeds.png").unlink(missing_ok=True)
    return blocks


def learning_curve_figure(curve: list[dict]) -> Figure:
    """The reward model's held-out accuracy against the training pairs it had seen (first pass; a later epoch is
    a separate point), with chance and the study's 75% target drawn in."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from ppo_rlhf.study.findings import TARGET_RM_ACCURACY

    figure = Figure(figsize=(6.4, 4.0), layout="constrained")
    axis = figure.subplots()
    first = [point for point in curve if point["epochs"] <= 1]
    axis.plot([p["pairs"] for p in first], [p["accuracy"] for p in first], marker="o", label="first pass")
    for point in curve:
        if point["epochs"] > 1:
            axis.plot([point["pairs"]], [point["accuracy"]], marker="s", linestyle="none",
                      label=f"after {point['epochs']} epochs")
    axis.axhline(0.5, color="grey", linewidth=0.8, linestyle=":", label="chance")
    axis.axhline(TARGET_RM_ACCURACY, color="grey", linewidth=0.8, linestyle="--", label="target")
    axis.set_xlabel("training pairs seen")
    # two lines: in one, the label is longer than the axis is high, and the figure cuts both of its ends off
    axis.set_ylabel("held-out accuracy\n(share of pairs ranked like the gold judge)")
    axis.set_title("Does the reward model learn the gold judge's preferences?", fontsize=10)
    axis.set_ylim(-0.04, 1.04)  # an accuracy of 0 or 1 drawn on the frame would hide in it: a margin around [0, 1]
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # pairs are counted
    axis.grid(alpha=0.3)
    axis.legend(fontsize=9)
    return figure

# ---------------------------------------------------------------- tables


def _fmt(value: Any, spec: str) -> str:
    number = _number(value)
    return "nan" if math.isnan(number) else format(number, spec)


def history_table(histories: dict[str, list[dict]]) -> tuple[list[str], list[list[str]]]:
    """Each run's dashboard averaged over its first and its last EDGE_ITERATIONS iterations; one row, over all of
    them, for a run too short to have two such spans that do not overlap (they would repeat each other)."""
    header = ["run", "iterations"] + [label for _, label, _ in DASHBOARD]
    rows = []
    for name, history in histories.items():
        edges = [("first", history[:EDGE_ITERATIONS]), ("last", history[-EDGE_ITERATIONS:])]
        if len(history) < 2 * EDGE_ITERATIONS:
            edges = [("all", history)]
        for which, part in edges:
            cells = [name, f"{which} {len(part)}"]
            for key, _, spec in DASHBOARD:
                values = [v for v in (_number(row.get(key)) for row in part) if not math.isnan(v)]
                cells.append(spec.format(sum(values) / len(values)).strip() if values else "nan")
            rows.append(cells)
    return header, rows


def evaluation_table(summary: list[dict]) -> tuple[list[str], list[list[str]]]:
    header = ["model", "proxy change [95% CI]", "gold change [95% CI]", "proxy with EOS rule", "finished",
              "tokens", "KL", "distinct-2", "entropy", "length corr"]

    def interval(c: dict) -> str:
        return f"{_fmt(c['mean'], '+.3f')} [{_fmt(c['lo'], '+.3f')}, {_fmt(c['hi'], '+.3f')}]"

    rows = [
        [s["model"], interval(s["proxy_change"]), interval(s["gold_change"]), _fmt(s["proxy_eos"], "+.3f"),
         _fmt(s["finished"], ".2f"), _fmt(s["tokens"], ".1f"), _fmt(s["kl"], ".2f"), _fmt(s["distinct_2"], ".3f"),
         _fmt(s["entropy"], ".3f"), length_correlation(s)]
        for s in summary
    ]
    return header, rows


def example_table(example: dict) -> tuple[list[str], list[list[str]]]:
    header = ["model", "proxy", "gold", "tokens", "reply"]
    rows = [[r["model"], _fmt(r["proxy"], "+.2f"), _fmt(r["gold"], "+.2f"), str(r["tokens"]), shown_reply(r["reply"])]
            for r in example["replies"]]
    return header, rows


# ---------------------------------------------------------------- rendering


def _md_text(text: str) -> str:
    # replies are arbitrary text: keep "<tag>" from being read as HTML by a Markdown viewer; only a "<" that can open
    # a tag needs it, and the page's own "->" and "<=" read as they are in the .md file too
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", text)


def _md_cell(text: str) -> str:
    return _md_text(text).replace("|", "\\|").replace("\n", "<br>")


def render_markdown(title: str, blocks: list[Block]) -> str:
    lines = [f"# {title}", ""]
    for block in blocks:
        kind = block[0]
        if kind == "h2":
            lines += [f"## {block[1]}", ""]
        elif kind == "p":
            lines += [_md_text(block[1]), ""]
        elif kind == "table":
            header, rows = block[1], block[2]
            lines.append("| " + " | ".join(header) + " |")
            lines.append("|" + "---|" * len(header))
            lines += ["| " + " | ".join(_md_cell(cell) for cell in row) + " |" for row in rows]
            lines.append("")
        elif kind == "img":
            lines += [f"![{block[2]}]({block[1]})", ""]
        elif kind == "pre":
            lines += ["```", block[1].rstrip("\n"), "```", ""]
    return "\n".join(lines)


STYLE = """body { font-family: sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
td { white-space: pre-wrap; } img { max-width: 100%; } pre { background: #f6f6f6; padding: 1em; overflow-x: auto; }"""


def render_html(title: str, blocks: list[Block], image_dir: Path) -> str:
    """A self-contained page: the PNGs are inlined as base64 data URIs."""
    escape = html.escape
    parts = [f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{escape(title)}</title>",
             f"<style>{STYLE}</style></head><body>", f"<h1>{escape(title)}</h1>"]
    for block in blocks:
        kind = block[0]
        if kind == "h2":
            parts.append(f"<h2>{escape(block[1])}</h2>")
        elif kind == "p":
            parts.append(f"<p>{escape(block[1])}</p>")
        elif kind == "table":
            header, rows = block[1], block[2]
            parts.append("<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>")
            parts += ["<tr>" + "".join(f"<td>{escape(cell)}</td>" for cell in row) + "</tr>" for row in rows]
            parts.append("</table>")
        elif kind == "img":
            data = base64.b64encode((image_dir / block[1]).read_bytes()).decode("ascii")
            parts.append(f"<figure><img src='data:image/png;base64,{data}' alt='{escape(block[2])}'>"
                         f"<figcaption>{escape(block[2])}</figcaption></figure>")
        elif kind == "pre":
            parts.append(f"<pre>{escape(block[1])}</pre>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


# ---------------------------------------------------------------- the report


def shown_spec(spec: Any, out_dir: Path) -> str:
    """A judge or model as the page names it: an absolute local path (the evaluation saves them so) relative to the
    report's folder, so that the page reads the same wherever the study's folder is."""
    text = str(spec)
    prefix = next((p for p in ("rm:", "rm-init-head:") if text.startswith(p)), "")
    path = text.removeprefix(prefix)
    return prefix + (os.path.relpath(path, out_dir.resolve()) if Path(path).is_absolute() else path)


def _evaluation_blocks(evaluation: dict[str, Any], out_dir: Path) -> list[Block]:
    summary = evaluation["summary"]
    settings = evaluation.get("settings", {})
    blocks: list[Block] = [("h2", "Scores on held-out prompts, against the start model")]
    if settings:
        kl = f" KL: the {settings['kl']}." if "kl" in settings else ""  # (older evaluations do not say)
        proxy, gold = (shown_spec(settings.get(judge), out_dir) for judge in ("proxy", "gold"))
        replies = settings.get("replies_per_prompt")
        blocks.append(("p", f"{settings.get('n_prompts')} held-out prompts x {replies} "
                            f"repl{'y' if replies == 1 else 'ies'} per model, sampling seed {settings.get('seed')}; "
                            f"proxy {proxy}, gold {gold}"
                            ". Scores in start-model standard deviations; changes are paired with the start model's "
                            "reply to the same prompt; their 95% intervals resample prompts (all replies of a drawn "
                            f"prompt together).{kl}"))
    blocks.append(("table", *evaluation_table(summary)))
    if any(s["run"] is not None for s in summary):
        overoptimisation_figure(summary).savefig(out_dir / "overoptimisation.png", dpi=100)
        blocks.append(("img", "overoptimisation.png", "gold and proxy change against KL to the start model, every "
                       "evaluated checkpoint of every run (bars: 95% intervals over prompts)"))
    examples = evaluation.get("examples", [])
    if examples:
        blocks.append(("h2", "Example replies, before and after training"))
        for example in examples:
            blocks.append(("p", f"PROMPT: {example['prompt']}"))
            blocks.append(("table", *example_table(example)))
    return blocks


def _study_blocks(study: dict[str, Any], evaluation: dict[str, Any] | None, out_dir: Path) -> list[Block]:
    """The demo's opening: the smoke-run note, the result in words, the content note, the caveats, the reward
    model's learning curve."""
    from ppo_rlhf.study.findings import CONTENT_NOTE, SMOKE_NOTE, caveats, headline

    blocks: list[Block] = []
    if study.get("quick"):
        blocks.append(("p", SMOKE_NOTE))
    if evaluation is not None and study.get("arms"):
        from ppo_rlhf.study.curves import arm_curves

        study["curves"] = arm_curves(evaluation["records"], evaluation["summary"], study["arms"])
        (out_dir / "curves.json").write_text(json.dumps(study["curves"], indent=1) + "\n")
    if evaluation is not None:
        blocks += [("h2", "The result")] + [("p", text) for text in headline(evaluation, study)]
    if study.get("realtoxicityprompts"):  # after the result, before any quoted reply
        blocks.append(("p", CONTENT_NOTE))
    notes = [] if evaluation is None else caveats(evaluation["summary"], evaluation.get("settings", {}),
                                                  study.get("rm_info"), study.get("settings"))
    if notes:
        blocks += [("h2", "Read with care")] + [("p", note) for note in notes]
    rm_info = study.get("rm_info")
    if evaluation is not None and study.get("curves"):
        blocks += arms_blocks(study["curves"], evaluation, study["arms"], out_dir)
    if rm_info is not None and rm_info.get("learning_curve"):
        learning_curve_figure(rm_info["learning_curve"]).savefig(out_dir / "learning_curve.png", dpi=100)
        rows = [[str(p["pairs"]), str(p["epochs"]), _fmt(p["accuracy"], ".3f"), _fmt(p["mean_margin"], "+.3f"),
                 _fmt(p["length_corr"], "+.2f")] for p in rm_info["learning_curve"]]
        blocks += [("h2", "The reward model: how well it learned the gold judge"),
                   ("img", "learning_curve.png", f"held-out accuracy on {rm_info['heldout_pairs']} pairs of prompts "
                                                 "it never trained on, against the training pairs seen"),
                   ("table", ["training pairs seen", "epochs", "held-out accuracy", "mean margin",
                              "margin-length correlation"], rows)]
    return blocks


def write_report(run_dirs: Sequence[str | Path], eval_dir: str | Path | None, out_dir: str | Path,
                 study: dict[str, Any] | None = None) -> Path:
    """Write the PNGs, report.md and report.html into out_dir; return the path of report.html.

    `study` (from the demo) opens the page with the result in words (see findings.headline for its keys, plus
    "quick" and "realtoxicityprompts") and the reward model's learning curve."""
    require(bool(run_dirs) or eval_dir is not None, "give at least one RUN_DIR or --eval EVAL_DIR")
    histories: dict[str, list[dict]] = {}
    for run_dir in map(Path, run_dirs):
        name = run_dir.resolve().name
        require(name not in histories, f"two runs are named {name!r}; give their folders different names")
        histories[name] = read_history(run_dir)
    evaluation = read_evaluation(Path(eval_dir)) if eval_dir is not None else None

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    blocks: list[Block] = [] if study is None else _study_blocks(study, evaluation, out_dir)
    if histories:
        dashboard_figure(histories).savefig(out_dir / "dashboard.png", dpi=100)
        blocks += [
            ("h2", "How training went, iteration by iteration"),
            ("img", "dashboard.png", "the dashboard over iterations, one line per run, then the reward-hacking "
                                     "monitor: how closely the reward follows reply length, the share of the reward "
                                     "gained since the start that longer replies explain, and any second judge "
                                     "(monitor_judges); [brackets]: the name in history.jsonl or on the dashboard "
                                     "line"),
            ("table", *history_table(histories)),
        ]
        machines = machine_sentence(list(map(Path, run_dirs)))
        blocks += [("p", machines)] if machines else []
    if evaluation is not None:
        blocks += _evaluation_blocks(evaluation, out_dir)
    for run_dir in map(Path, run_dirs):
        table = run_dir / "token_table.txt"
        if table.is_file():
            blocks += [("h2", f"Per-token table: {run_dir.resolve().name}"), ("pre", table.read_text())]

    if study is not None:
        title = "What PPO against a learned reward model really gained" + (" (smoke run)" if study.get("quick") else "")
    else:
        title = "PPO report: " + ", ".join(histories) if histories else "PPO evaluation report"
    (out_dir / "report.md").write_text(render_markdown(title, blocks))
    page = out_dir / "report.html"
    page.write_text(render_html(title, blocks, out_dir))
    return page


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="training run folders (with history.jsonl)")
    parser.add_argument("--eval", dest="eval_dir", metavar="EVAL_DIR", help="a ppo-rlhf evaluate --out folder")
    parser.add_argument("--out", required=True, metavar="REPORT_DIR",
                        help="folder for the PNGs, report.md, report.html")


def run(args: argparse.Namespace) -> int:
    page = write_report(args.run_dirs, args.eval_dir, args.out)
    print(f"wrote {page}")
    return 0
