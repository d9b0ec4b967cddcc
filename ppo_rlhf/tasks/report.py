"""The task demo's report (`ppo-rlhf demo --task`): what PPO did to held-out accuracy on a verifiable task, in words
generated from the numbers, plots, a table of every model and examples before and after.

From OUT/eval/task_eval.json (`task_eval.evaluate_task_runs`), the run's history.jsonl and the stages' times, into
OUT/report: report.html (self-contained), report.md next to the PNGs (accuracy.png, accuracy_vs_kl.png, length.png,
dashboard.png; a multi-turn task's also turns.png) and summary.txt (the opening, the stage times and the table, as
the demo prints them). A multi-turn task (calc-steps) adds its turns and tool use before and after (`tool_sentence`,
the table's episode columns, turns.png) and shows each example's whole episode.

The sentences (`opening_sentence`, `tool_sentence`, `time_sentence`) are pure functions of the summary and the
timings, tested on made-up numbers: the report never states a result its numbers do not give.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ppo_rlhf.study.evaluate import shown_reply
from ppo_rlhf.study.report import Block, dashboard_figure, machine_sentence, read_history, render_html, render_markdown
from ppo_rlhf.study.sampling import START
from ppo_rlhf.tasks.arithmetic import extracted_answer, problems
from ppo_rlhf.utils.files import atomic_write_text

if TYPE_CHECKING:  # matplotlib is imported by the functions that draw
    from matplotlib.figure import Figure

GOAL_SECONDS = 30 * 60  # the goal: the gain's interval should exclude zero within 30 minutes on a 2-core machine
EXAMPLES = 8


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def interval(c: dict[str, float], signed: bool = False) -> str:
    """"17.5% [12.5, 23.0]", or signed points "+53.0 [+46.0, +60.5]"."""
    if signed:
        return f"{100 * c['mean']:+.1f} [{100 * c['lo']:+.1f}, {100 * c['hi']:+.1f}]"
    return f"{percent(c['mean'])} [{100 * c['lo']:.1f}, {100 * c['hi']:.1f}]"


def excludes_zero(c: dict[str, float]) -> bool:
    return c["lo"] > 0 or c["hi"] < 0


def last_model(summary: list[dict]) -> dict:
    """The summary of the latest checkpoint (of the first run that has one)."""
    trained = [s for s in summary if s["run"] is not None]
    return max(trained, key=lambda s: s["iteration"])


def opening_sentence(summary: list[dict], task: str, quick: bool = False) -> str:
    """The result in words: start and last accuracy, the change with its 95% interval, and whether that interval
    excludes zero (and if it does not, what that means)."""
    start, last = summary[0], last_model(summary)
    change, n = last["accuracy_change"], last["problems"]
    text = (f"On {n} held-out {task} problems, exact match went from {interval(start['accuracy'])} (start model) to "
            f"{interval(last['accuracy'])} after {last['iteration']} iterations: a change of "
            f"{interval(change, signed=True)} points (95% paired bootstrap over problems), an interval that ")
    if change["lo"] > 0:
        text += "excludes zero: PPO raised held-out accuracy."
    elif change["hi"] < 0:
        text += "excludes zero: held-out accuracy fell."
    elif change["lo"] == change["hi"] == 0:  # every paired difference is zero
        text += ("includes zero: the last checkpoint was right on exactly the problems the start model was right on, "
                 "so there is no change to measure.")
    else:
        half = 100 * (change["hi"] - change["lo"]) / 2
        text += (f"includes zero, so this run does not show a change in held-out accuracy: with {n} problems the "
                 f"interval is about ±{half:.1f} points wide, and a smaller change cannot be told from sampling noise "
                 "(more iterations, or more held-out problems, would be needed).")
    if quick:
        return (f"A smoke run (--quick: {n} held-out problems, {last['iteration']} iterations of a small batch at a "
                f"short reply cap), not a result: its numbers are too small to mean anything. {text}")
    return text


def _episodes(s: dict) -> str:
    return (f"{s['tool_use']:.0%} of episodes called a tool ({s['tool_calls']:.2f} calls, {s['tool_errors']:.2f} "
            f"tool errors and {s['turns']:.2f} turns per episode)")


def tool_sentence(summary: list[dict]) -> str:
    """A multi-turn task's tool use and turns, start model against the last checkpoint ("" for a one-reply task)."""
    if "turns" not in summary[0]:
        return ""
    start, last = summary[0], last_model(summary)
    return (f"Tool use: at the start {_episodes(start)}; after {last['iteration']} iterations {_episodes(last)}. "
            "A tool error is a call the tool could not make (an unknown tool, arguments it does not take).")


def time_sentence(timings: dict[str, float], goal: float = GOAL_SECONDS) -> str:
    """The stages' seconds (as each last ran), their total, and whether it was under the goal's 30 minutes."""
    total = sum(timings.values())
    parts = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())
    verdict = "under" if total < goal else "over"
    return (f"Stage times (each stage's last run; a stage continued after a kill counts only its last part): {parts}; "
            f"total {total:.0f} s ({total / 60:.1f} minutes), {verdict} the {goal / 60:.0f} minutes of the goal.")


# ---------------------------------------------------------------- plots


def _iteration(s: dict) -> int:
    return 0 if s["run"] is None else int(s["iteration"])


def accuracy_figure(summary: list[dict]) -> Figure:
    """Held-out exact match against iteration, the start model at 0, with the 95% band."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    figure = Figure(figsize=(6.4, 4.0), layout="constrained")
    axis = figure.subplots()
    x = [_iteration(s) for s in summary]
    axis.fill_between(x, [s["accuracy"]["lo"] for s in summary], [s["accuracy"]["hi"] for s in summary], alpha=0.25,
                      label="95% interval (bootstrap over problems)")
    axis.plot(x, [s["accuracy"]["mean"] for s in summary], marker="o", label="exact match")
    axis.set_xlabel("PPO iteration (0: the start model)")
    axis.set_ylabel("held-out exact match")
    axis.set_title("Held-out accuracy over training", fontsize=10)
    axis.set_ylim(-0.04, 1.04)
    axis.yaxis.set_major_formatter(PercentFormatter(1.0))
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.grid(alpha=0.3)
    axis.legend(fontsize=9)
    return figure


def kl_figure(summary: list[dict]) -> Figure:
    """Held-out exact match against the mean KL to the start model (nats per reply), each point's iteration noted."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    figure = Figure(figsize=(6.4, 4.0), layout="constrained")
    axis = figure.subplots()
    means = [s["accuracy"]["mean"] for s in summary]
    errors = [[m - s["accuracy"]["lo"] for m, s in zip(means, summary)],
              [s["accuracy"]["hi"] - m for m, s in zip(means, summary)]]
    kls = [s["kl"] for s in summary]
    axis.errorbar(kls, means, yerr=errors, capsize=3, marker="o")
    for s, x, y in zip(summary, kls, means):
        axis.annotate("start" if s["run"] is None else f"it {s['iteration']}", (x, y), textcoords="offset points",
                      xytext=(5, 5), fontsize=8)
    axis.set_xlabel("KL to the start model (nats per reply)")
    axis.set_ylabel("held-out exact match")
    axis.set_title("Accuracy gained against distance moved (bars: 95% interval)", fontsize=10)
    axis.set_ylim(-0.04, 1.04)
    axis.yaxis.set_major_formatter(PercentFormatter(1.0))
    axis.grid(alpha=0.3)
    return figure


def length_figure(summary: list[dict], history: list[dict]) -> Figure:
    """Finished share and mean reply tokens against iteration: the held-out replies of each evaluated model (markers)
    and every training batch (a line; iteration i's batch is sampled by the policy after i updates)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(11, 3.8), layout="constrained")
    axes = figure.subplots(1, 2)
    x = [_iteration(s) for s in summary]
    for axis, (key, train_key, title, unit) in zip(axes, (
            ("finished", "fin", "Replies that ended (EOS) within the cap", "share of replies"),
            ("tokens", "len", "Mean reply length", "tokens"))):
        axis.plot([row["iteration"] for row in history], [_float(row.get(train_key)) for row in history],
                  alpha=0.6, label="training batches")
        axis.plot(x, [s[key] for s in summary], marker="o", linestyle="none", label="held-out replies")
        axis.set_title(title, fontsize=10)
        axis.set_ylabel(unit)
        axis.set_xlabel("PPO iteration")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=9)
    axes[0].set_ylim(-0.04, 1.04)
    return figure


EPISODE_PANELS = (("turns", "Policy turns per episode", "turns"), ("tool_calls", "Tool calls per episode", "calls"),
                  ("tool_errors", "Tool errors per episode", "errors"))


def turns_figure(summary: list[dict], history: list[dict]) -> Figure:
    """A multi-turn task's turns, tool calls and tool errors per episode against iteration: the held-out episodes of
    each evaluated model (markers) and every training batch (a line)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(13, 3.8), layout="constrained")
    x = [_iteration(s) for s in summary]
    for axis, (key, title, unit) in zip(figure.subplots(1, len(EPISODE_PANELS)), EPISODE_PANELS):
        axis.plot([row["iteration"] for row in history], [_float(row.get(key)) for row in history], alpha=0.6,
                  label="training batches")
        axis.plot(x, [s[key] for s in summary], marker="o", linestyle="none", label="held-out episodes")
        axis.set_title(title, fontsize=10)
        axis.set_ylabel(unit)
        axis.set_xlabel("PPO iteration")
        axis.set_ylim(bottom=0)
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=9)
    return figure


def _float(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


# ---------------------------------------------------------------- tables


def model_table(summary: list[dict]) -> tuple[list[str], list[list[str]]]:
    """A row per model; a multi-turn task's rows also hold its episodes' tool use, tool calls, errors and turns."""
    header = ["model", "held-out exact match [95%]", "change, points [95%]", "KL", "format", "finished", "tokens"]
    rows = [[s["model"], interval(s["accuracy"]), "" if s["run"] is None else interval(s["accuracy_change"], True),
             f"{s['kl']:.2f}", f"{s['formatted']:.0%}", f"{s['finished']:.0%}", f"{s['tokens']:.1f}"]
            for s in summary]
    if "turns" in summary[0]:
        header += ["tool use", "tool calls", "tool errors", "turns"]
        for row, s in zip(rows, summary):
            row += [f"{s['tool_use']:.0%}", f"{s['tool_calls']:.2f}", f"{s['tool_errors']:.2f}", f"{s['turns']:.2f}"]
    return header, rows


def mark(record: dict) -> str:
    read = extracted_answer(record["reply"])
    return "✓ correct" if record["correct"] else f"✗ wrong (read: {'no number' if read is None else read})"


def example_table(records: list[dict], summary: list[dict], answers: list[str], n: int = EXAMPLES
                  ) -> tuple[list[str], list[list[str]]]:
    """The start model's reply and the last checkpoint's to the same held-out problems (their first replies): taken in
    turn from the problems the training fixed, broke, kept right and kept wrong, so that every kind shows. A
    multi-turn record shows its whole episode (its transcript: turns, tool calls and results)."""
    last = last_model(summary)["model"]
    by_key = {(r["model"], r["prompt_index"], r["reply_index"]): r for r in records}
    kinds: dict[tuple[float, float], list[tuple[dict, dict]]] = {(0.0, 1.0): [], (1.0, 0.0): [], (1.0, 1.0): [],
                                                                 (0.0, 0.0): []}
    for (model, prompt, reply), before in sorted(by_key.items(), key=lambda item: item[0][1:]):
        after = by_key.get((last, prompt, reply))
        if model == START and reply == 0 and after is not None:
            kinds[(before["correct"], after["correct"])].append((before, after))
    chosen: list[tuple[dict, dict]] = []
    while len(chosen) < n and any(kinds.values()):
        for group in kinds.values():
            if group and len(chosen) < n:
                chosen.append(group.pop(0))
    header = ["problem", "answer", "start model", last]
    def shown(record: dict) -> str:
        return f"{mark(record)}\n{shown_reply(record.get('transcript', record['reply']))}"

    def asked(prompt: str | list[dict]) -> str:  # a chat prompt (calc-steps') by its last message, the question
        return prompt if isinstance(prompt, str) else prompt[-1]["content"]

    rows = [[asked(before["prompt"]), answers[before["prompt_index"]], shown(before), shown(after)]
            for before, after in chosen]
    return header, rows


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *rows])


# ---------------------------------------------------------------- the page


def write_task_report(eval_file: str | Path, run_dir: str | Path, out_dir: str | Path, timings: dict[str, float],
                      quick: bool = False) -> Path:
    """Write report.html, report.md, summary.txt and the PNGs into out_dir; returns report.html's path."""
    evaluation = json.loads(Path(eval_file).read_text())
    settings, summary, records = evaluation["settings"], evaluation["summary"], evaluation["records"]
    task = settings["level"]
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    history = read_history(run_dir)
    answers = [row["answer"] for row in problems(task, "heldout", settings["n_heldout"])]
    out_dir.mkdir(parents=True, exist_ok=True)
    accuracy_figure(summary).savefig(out_dir / "accuracy.png", dpi=100)
    kl_figure(summary).savefig(out_dir / "accuracy_vs_kl.png", dpi=100)
    length_figure(summary, history).savefig(out_dir / "length.png", dpi=100)
    dashboard_figure({run_dir.resolve().name: history}).savefig(out_dir / "dashboard.png", dpi=100)
    tools = tool_sentence(summary)
    if tools:
        turns_figure(summary, history).savefig(out_dir / "turns.png", dpi=100)

    opening, times = " ".join(filter(None, (opening_sentence(summary, task, quick), tools))), time_sentence(timings)
    table = model_table(summary)
    machine = machine_sentence([run_dir])
    unit = "episode" if tools else "reply"
    episodes = (f" in episodes of at most {settings['max_turns']} turns and {settings['max_tool_calls']} tool calls "
                f"({settings['max_episode_tokens']} tokens after the prompt), the last turn's text the answer; "
                "tokens and KL count the policy's tokens only" if tools else "")
    how = (f"Every model answered the same {settings['n_heldout']} held-out problems (never trained on), "
           f"{settings['replies_per_prompt']} {unit} each, sampled at temperature {settings['temperature']} with "
           f"torch's seed {settings['seed']} reset before each model, at most {settings['max_new_tokens']} tokens a "
           f"turn{episodes}; a reply is correct when its answer (its last 'Answer:' line, else its last integer) "
           "equals the problem's exactly. Intervals: 95% bootstrap over problems; a change pairs each problem's "
           "replies with the start model's. Format: replies that end with the asked-for 'Answer: N' line.")
    blocks: list[Block] = [("p", opening), ("p", times), *([("p", machine)] if machine else []),
                           ("h2", "Held-out accuracy over training"),
                           ("img", "accuracy.png", "held-out exact match after each checkpoint's iterations"),
                           ("img", "accuracy_vs_kl.png", "held-out exact match against KL to the start model"),
                           ("h2", "Finished replies and reply length"),
                           ("img", "length.png", "held-out replies of each evaluated model and every training batch"),
                           *([("h2", "Turns and tool use"),
                              ("img", "turns.png", "held-out episodes of each evaluated model and every training "
                                                   "batch")] if tools else []),
                           ("h2", "Every model"), ("table", *table), ("p", how),
                           ("h2", "Before and after: the same held-out problems"),
                           ("table", *example_table(records, summary, answers)),
                           ("h2", "How training went, iteration by iteration"),
                           ("img", "dashboard.png", "the training dashboard (training batches, not held-out)")]
    title = f"PPO on a verifiable task: held-out {task} accuracy" + (" (smoke run)" if quick else "")
    atomic_write_text(out_dir / "report.md", render_markdown(title, blocks))
    atomic_write_text(out_dir / "summary.txt", f"{opening}\n{times}\n\n{_text_table(*table)}\n")
    page = out_dir / "report.html"
    atomic_write_text(page, render_html(title, blocks, out_dir))
    return page
