"""What one iteration measures (section 8.9): the dashboard line, the JSONL history, TensorBoard scalars,
sample replies, and the per-token table of one reply (section 8.6). The reward-hacking monitor's numbers
(ppo/monitor.py) go under their own tracker section, `monitor/`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

# (key, label, format) in the order of the chapter's dashboard line.
DASHBOARD = [
    ("score", "score", "{:+.3f}"),
    ("rm_raw", "rm_raw", "{:+.3f}"),
    ("kl", "kl", "{:6.2f}"),
    ("len", "len", "{:5.1f}"),
    ("fin", "fin", "{:.2f}"),
    ("ent", "ent", "{:.3f}"),
    ("clipfrac", "clipfrac", "{:.3f}"),
    ("approx_kl", "approx_kl", "{:.4f}"),
    ("v_loss", "v_loss", "{:.3f}"),
    ("ev", "ev", "{:+.2f}"),
    ("vclipfrac", "vclip", "{:.2f}"),
]
# advantage_estimator ev-gated: which advantages the batch used (1 the critic's GAE, 0 the group baseline), after `ev`
GATE_LINE = ("ev_gate", "gate", "{:.0f}")
# a multi-turn run's episodes (docs/multi-turn.md), shown after `ev` when the stats have them
EPISODE_LINE = [
    ("env_reward", "env_r", "{:+.2f}"),
    ("turns", "turns", "{:.2f}"),
    ("tool_calls", "tools", "{:.2f}"),
    ("tool_errors", "tool_err", "{:.2f}"),
    ("masked_share", "masked", "{:.2f}"),
]
# the reward-hacking monitor (ppo/monitor.py): its history keys, and the one the dashboard line shows, as `len_r`
MONITOR_KEYS = ("reward_length_corr", "length_share")
MONITOR_LINE = ("reward_length_corr", "len_r", "{:+.2f}")


# Why a number on the dashboard line is "-" (nothing measured in that iteration), said the first time it happens
NOT_MEASURED = {
    "clipfrac": "clipfrac and approx_kl are '-' in a critic warm-up iteration: the policy takes no step to measure",
    "v_loss": "v_loss and vclip are '-' without a value model (rloo, grpo): there is no critic to train",
    "ev": "ev is '-' without a value model, or when the batch's returns do not vary (nothing to explain)",
    "reward_length_corr": "len_r is '-' when the batch's replies all have one length (or all one reward): no "
                          "correlation to measure",
}
NEGATIVE_KL = ("kl is below 0: the chapter's k1 estimate (log pi - log pi_ref on the sampled tokens) is unbiased, "
               "so a batch's mean can fall below 0 while the true KL is near 0; its sign is then noise")


def not_measured(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _fmt(fmt: str, value: Any) -> str:
    return "-" if not_measured(value) else fmt.format(value)


def dashboard_notes(stats: dict[str, Any], said: set[str]) -> list[str]:
    """The first time in a run that a dashboard number is "-" (NOT_MEASURED) or the k1 KL is negative: one line
    saying why; `said` remembers what was said."""
    notes = [(key, why) for key, why in NOT_MEASURED.items() if key in stats and not_measured(stats[key])]
    kl = stats.get("kl")
    if stats.get("kl_used", "k1 in reward").startswith("k1") and isinstance(kl, float) and kl < 0:
        notes.append(("negative kl", NEGATIVE_KL))
    fresh = [(key, why) for key, why in notes if key not in said]
    said.update(key for key, _ in fresh)
    return [f"(note: {why})" for _, why in fresh]


def dashboard_line(stats: dict[str, Any]) -> str:
    """`step   0  score -0.125  rm_raw +4.178  kl   0.00 ...  (54s, gen 6s)`"""
    parts = [f"step {stats['iteration']:3d}"]
    if stats.get("phase", "policy") != "policy":  # critic warm-up: the policy did not move
        parts.append(f"[{stats['phase']}]")
    # the KL that is not the chapter's (k1 in the reward) says which it is
    kl_label = "kl" if stats.get("kl_used", "k1 in reward") == "k1 in reward" else f"kl[{stats['kl_used']}]"
    for key, label, fmt in DASHBOARD:
        parts.append(f"{kl_label if key == 'kl' else label} {_fmt(fmt, stats.get(key))}")
        if key == "ev" and GATE_LINE[0] in stats:
            parts.append(f"{GATE_LINE[1]} {_fmt(GATE_LINE[2], stats[GATE_LINE[0]])}")
    parts += [f"{label} {_fmt(fmt, stats[key])}" for key, label, fmt in EPISODE_LINE if key in stats]
    key, label, fmt = MONITOR_LINE
    if key in stats:  # (stats from before the monitor have none)
        parts.append(f"{label} {_fmt(fmt, stats[key])}")
    timing = (f"({stats['time_total']:.0f}s, gen {stats['time_gen']:.0f}s, score {stats['time_score']:.0f}s, "
              f"update {stats['time_update']:.0f}s)")
    skipped = f"  skipped {stats['skipped_steps']}" if stats.get("skipped_steps") else ""
    return "  ".join(parts) + f"  {timing}{skipped}"


def history_line(stats: dict[str, Any]) -> str:
    return json.dumps(stats, allow_nan=True) + "\n"


def scalar_tag(key: str) -> str:
    """`ppo/score`, `time/time_gen`, `ppo/reward/<name>`; the monitor's `monitor/reward_length_corr`,
    `monitor/length_share` and `monitor/<judge>`."""
    if key.startswith("monitor/"):
        return key
    section = "time" if key.startswith("time_") else "monitor" if key in MONITOR_KEYS else "ppo"
    return f"{section}/{key}"


def scalar_tags(stats: dict[str, Any]) -> dict[str, float]:
    """The numbers of one iteration's stats under the names every tracker shows them by (`scalar_tag`); strings
    such as `phase`, the step itself and None (a monitor number undefined this iteration) are left out."""
    return {scalar_tag(key): value for key, value in stats.items()
            if isinstance(value, (int, float)) and key != "iteration"}


class TensorBoard:
    """Scalars under RUN_DIR/tb."""

    def __init__(self, folder: Path, first_iteration: int = 0):
        from torch.utils.tensorboard import SummaryWriter  # lazy: report reads DASHBOARD without torch

        # purge_step: a resumed run drops the points a killed run logged after its last checkpoint
        self.writer = SummaryWriter(str(folder), purge_step=first_iteration or None)

    def log(self, stats: dict[str, Any]) -> None:
        for tag, value in scalar_tags(stats).items():
            self.writer.add_scalar(tag, value, stats["iteration"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def token_table_text(rows: list[dict[str, Any]], header: str, estimator: str = "gae") -> str:
    """The per-token table of section 8.6: `t  token  log pi_old  log pi_ref  V(s_t)  r_t  A_t (GAE)  return`.

    A_t is the advantage before whitening, so that return = A_t + V(s_t) on every row, as in the chapter; the
    whitened A_t that the policy loss uses follows in its own column. rloo and grpo do not whiten: their one
    A_t column is named after the estimator.
    """
    # (row key, title, width, number format); the token is left-aligned, numbers right-aligned
    columns = [("t", "t", 3, "d"), ("token", "token", 16, ""), ("logp_old", "log pi_old", 10, ".3f"),
               ("logp_ref", "log pi_ref", 10, ".3f"), ("value", "V(s_t)", 8, ".3f"), ("reward", "r_t", 8, "+.3f"),
               ("advantage", f"A_t ({estimator.upper()})", 10, "+.3f"), ("return", "return", 8, "+.3f")]
    if estimator == "gae":
        columns.append(("advantage_whitened", "A_t whitened", 12, "+.3f"))

    def cell(text: str, key: str, width: int) -> str:
        return f"{text:<{width}}" if key == "token" else f"{text:>{width}}"

    lines = [header, " ".join(cell(title, key, width) for key, title, width, _ in columns)]
    for row in rows:
        row = {k: v + 0.0 if isinstance(v, float) else v for k, v in row.items()}  # print -0.0 (from -beta * 0) as 0.0
        row["token"] = repr(row["token"])[:16]
        lines.append(" ".join(cell(format(row[key], spec), key, width) for key, _, width, spec in columns))
    return "\n".join(lines) + "\n"
