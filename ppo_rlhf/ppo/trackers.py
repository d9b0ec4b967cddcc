"""Where a run's numbers go besides history.jsonl (`report_to`): TensorBoard under RUN_DIR/tb, Weights & Biases,
trackio; and RUN_DIR/completions.jsonl, the prompts, completions and rewards of every log_completions_every-th
iteration, which also go to each tracker as a table.

Every tracker shows an iteration's numbers under the same names (`dashboard.scalar_tags`: `ppo/score`,
`time/time_gen`, `ppo/reward/<name>`, ...) at step = the iteration; strings such as `phase` stay in history.jsonl.
wandb and trackio are optional dependencies (`pip install 'ppo-rlhf[wandb]'`), imported only when named.

- tensorboard: `dashboard.TensorBoard`, unchanged; the completions table is a markdown text under `completions`.
- wandb: the user's WANDB_* environment applies (WANDB_MODE=offline logs to RUN_DIR/wandb only; WANDB_PROJECT,
  WANDB_NAME, WANDB_DIR and WANDB_RUN_ID win over the defaults: project `ppo-rlhf`, the run directory's name,
  RUN_DIR). A resumed run continues the W&B run its run directory started (its id is kept in RUN_DIR/wandb_run_id);
  W&B logs a step once, so it keeps what a killed run logged after its last checkpoint and warns about the repeats.
- trackio: local, in trackio's own folder (TRACKIO_DIR, default ~/.cache/huggingface/trackio) where `trackio show`
  finds it, project `ppo-rlhf`, run named after the run directory; a resumed run continues the latest trackio run of
  that name. TRACKIO_SPACE_ID or TRACKIO_SERVER_URL send it elsewhere, as trackio does.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from ppo_rlhf.errors import UsageError, require
from ppo_rlhf.ppo.dashboard import TensorBoard, scalar_tags
from ppo_rlhf.utils.files import atomic_write_text, keep_iterations_before

TRACKERS = ("tensorboard", "wandb", "trackio")
OPTIONAL = ("wandb", "trackio")  # each is its own pip extra of the same name
PROJECT = "ppo-rlhf"


def _missing(name: str) -> UsageError:
    return UsageError(f"report_to {name} needs {name}: pip install 'ppo-rlhf[{name}]'")


def _installed(name: str) -> bool:
    return name not in OPTIONAL or importlib.util.find_spec(name) is not None


def check_report_to(report_to: str | Sequence[str]) -> list[str]:
    """The trackers `report_to` names, in order and once each: "none" (or nothing) for none, "all" for every
    installed one. UsageError for an unknown name or a tracker whose package is not installed. Torch-free and
    import-free, so that the config checks can call it before anything heavy loads."""
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    choices = (*TRACKERS, "all", "none")
    for name in names:
        require(name in choices, f"report_to: unknown tracker {name!r}; choose from {', '.join(choices)}")
    if "none" in names:
        require(set(names) == {"none"}, "report_to: 'none' cannot be combined with a tracker")
        return []
    chosen = list(dict.fromkeys(tracker for name in names
                                for tracker in ([t for t in TRACKERS if _installed(t)] if name == "all" else [name])))
    for name in chosen:
        if not _installed(name):
            raise _missing(name)
    return chosen


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise _missing(name) from None


class CompletionsLog:
    """RUN_DIR/completions.jsonl: one line per completion, `{"iteration", "prompt", "completion", "score",
    "reward/<name>", ...}`, appended every log_completions_every iterations."""

    def __init__(self, run_dir: str | Path, first_iteration: int):
        self.path = Path(run_dir) / "completions.jsonl"
        keep_iterations_before(self.path, first_iteration)  # a resumed run writes those iterations again

    def write(self, rows: list[dict[str, Any]], iteration: int) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.writelines(json.dumps({"iteration": iteration, **row}, ensure_ascii=False) + "\n" for row in rows)


class Tracker(Protocol):
    def log(self, stats: dict[str, Any], step: int) -> None: ...

    def log_table(self, key: str, columns: list[str], rows: list[dict[str, Any]], step: int) -> None: ...

    def close(self) -> None: ...


def markdown_table(columns: list[str], rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table (TensorBoard's text tab renders it)."""
    def cell(value: Any) -> str:
        text = "" if value is None else f"{value:+.3f}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(column)) for column in columns) + " |" for row in rows]
    return "\n".join(lines)


class TensorBoardTracker:
    def __init__(self, run_dir: Path, config: dict[str, Any], first_iteration: int, run_name: str | None):
        self.board = TensorBoard(run_dir / "tb", first_iteration=first_iteration)

    def log(self, stats: dict[str, Any], step: int) -> None:
        self.board.log({**stats, "iteration": step})

    def log_table(self, key: str, columns: list[str], rows: list[dict[str, Any]], step: int) -> None:
        self.board.writer.add_text(key, markdown_table(columns, rows), step)
        self.board.writer.flush()

    def close(self) -> None:
        self.board.close()


class WandbTracker:
    def __init__(self, run_dir: Path, config: dict[str, Any], first_iteration: int, run_name: str | None):
        self.wandb = wandb = _import("wandb")
        # the W&B run this run directory started, continued on resume; a run from iteration 0 is a new one
        id_file = run_dir / "wandb_run_id"
        run_id = os.environ.get("WANDB_RUN_ID") or (
            id_file.read_text().strip() if first_iteration > 0 and id_file.is_file() else secrets.token_hex(4))
        atomic_write_text(id_file, run_id)
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT),
                                  name=run_name or os.environ.get("WANDB_NAME") or run_dir.resolve().name,
                                  dir=os.environ.get("WANDB_DIR", str(run_dir)), id=run_id, resume="allow",
                                  config=config)
        except wandb.errors.Error as error:  # no API key, no network: one line, and WANDB_MODE=offline still works
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UsageError(f"report_to wandb: {first_line} (WANDB_MODE=offline logs to {run_dir}/wandb only)"
                             ) from None

    def log(self, stats: dict[str, Any], step: int) -> None:
        self.run.log(scalar_tags(stats), step=step)

    def log_table(self, key: str, columns: list[str], rows: list[dict[str, Any]], step: int) -> None:
        table = self.wandb.Table(columns=columns, data=[[row.get(column) for column in columns] for row in rows])
        self.run.log({key: table}, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    def __init__(self, run_dir: Path, config: dict[str, Any], first_iteration: int, run_name: str | None):
        self.trackio = trackio = _import("trackio")
        # trackio continues a run by name: a resumed run continues it, a run from iteration 0 is a new one
        self.run = trackio.init(project=PROJECT, name=run_name or run_dir.resolve().name, config=config,
                                resume="allow" if first_iteration > 0 else "never", embed=False)

    def log(self, stats: dict[str, Any], step: int) -> None:
        self.run.log(scalar_tags(stats), step=step)

    def log_table(self, key: str, columns: list[str], rows: list[dict[str, Any]], step: int) -> None:
        table = self.trackio.Table(data=[{column: row.get(column) for column in columns} for row in rows])
        self.run.log({key: table}, step=step)

    def close(self) -> None:
        self.run.finish()


# name -> the tracker's class: (run_dir, config, first_iteration, run_name) -> a Tracker
MAKERS: dict[str, Callable[[Path, dict[str, Any], int, str | None], Tracker]] = {
    "tensorboard": TensorBoardTracker, "wandb": WandbTracker, "trackio": TrackioTracker}


class Trackers:
    """A run's trackers and its completions log, as one. Call it on the main process only."""

    def __init__(self, names: list[str], trackers: list[Tracker], completions: CompletionsLog):
        self.names, self.trackers, self.completions = names, trackers, completions

    def log(self, stats: dict[str, Any], step: int) -> None:
        """One iteration's stats (its numbers; strings are left out) at `step` = the iteration."""
        for tracker in self.trackers:
            tracker.log(stats, step)

    def log_completions(self, rows: list[dict[str, Any]], step: int) -> None:
        """Rows `{"prompt", "completion", "score", "reward/<name>", ...}` (prompt as text; a reward may be None):
        appended to RUN_DIR/completions.jsonl and sent to each tracker as the table `completions`."""
        self.completions.write(rows, step)
        columns = list(dict.fromkeys(key for row in rows for key in row))
        for tracker in self.trackers:
            tracker.log_table("completions", columns, rows, step)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def make_trackers(report_to: str | Sequence[str], run_dir: str | Path, config: dict[str, Any],
                  first_iteration: int, run_name: str | None = None) -> Trackers:
    """The trackers `report_to` names (see check_report_to), started for the run in `run_dir` from
    `first_iteration` (> 0 on resume: TensorBoard drops the killed run's later points, completions.jsonl the lines of
    iterations that run again, wandb and trackio continue the same run). `config` (plain values) goes to wandb and
    trackio; `run_name` defaults to the run directory's name."""
    names = check_report_to(report_to)
    run_dir = Path(run_dir)
    completions = CompletionsLog(run_dir, first_iteration)
    trackers: list[Tracker] = []
    try:
        for name in names:
            trackers.append(MAKERS[name](run_dir, config, first_iteration, run_name))
    except BaseException:  # the ones already started are closed: no dangling W&B or trackio run
        for tracker in trackers:
            tracker.close()
        raise
    return Trackers(names, trackers, completions)
