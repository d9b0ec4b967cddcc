"""`ppo-rlhf compare --task LEVEL`: PPO, PPO with a critic warm-up, RLOO and GRPO on a verifiable task at equal sampled
replies, measured on the same held-out problems.

Every variant is the task preset (`demo.preset`: configs/smollm2_add_tiny.yaml, smollm2_calc_steps.yaml for
calc-steps; or --config) with the same iterations, reply cap and
replies per iteration (batch_size), group_size 2 (RLOO and GRPO need groups; with one group size and seed every
variant draws the same prompts), and the flags given; only these differ:

  ppo          advantage_estimator gae, critic_warmup_iterations 0
  ppo-warmup   advantage_estimator gae, critic_warmup_iterations 3 (their replies are sampled too, and counted)
  ppo-turn     advantage_estimator gae, turn_level_gae (one GAE step per turn of a multi-turn episode)
  ev-gated     advantage_estimator ev-gated (EVPO: GAE while the critic explains the batch, else rloo's baseline)
  rloo         advantage_estimator rloo (no value model)
  grpo         advantage_estimator grpo (no value model; its KL in the loss, as by default)

(turn_level_gae false but for ppo-turn). Without --variants: ppo, ppo-warmup, rloo, grpo. With --horizons (and
--seeds) the comparison is `ppo_rlhf.tasks.horizons`'s: every variant at every horizon, several seeds.

Each variant trains in its own process (`python -m ppo_rlhf train --config OUT/configs/VARIANT.yaml`), so that its
peak memory is its own: the ru_maxrss of that process (os.wait4), i.e. host resident memory, not a GPU's. Its wall
time goes with it into OUT/VARIANT/process.json; seconds per iteration are the mean of its history's time_total.

The start model and the checkpoints named by --checkpoints (default every 10th iteration and the last) of every
variant answer the same held-out problems with the same sampling seed (`task_eval.evaluate_task_runs`), so every
comparison is paired. OUT/compare.txt and compare.json hold a table (final accuracy and its change with 95%
intervals, seconds per iteration, peak memory, sampled reply tokens) and a sentence generated from the numbers: which
variant had the highest final accuracy, and each other variant's paired difference from it with its 95% interval
(bootstrap over problems) and whether it excludes zero. OUT/compare.png: accuracy against cumulative sampled reply
tokens (len x batch_size summed over each run's iterations; multi-turn: the policy's tokens, len x (1 - masked_share)),
one curve per variant with its 95% band.

The data, each variant's training and the evaluation are stages as in the demo (`demo.Stages`: keyed, skipped when
done, a killed one continues); the table, sentence and plot are written again from the stored results every time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ppo_rlhf.config import build_config, read_yaml, to_yaml
from ppo_rlhf.errors import RunError, require
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.study.demo import Stages
from ppo_rlhf.tasks.arithmetic import check_task, write_task
from ppo_rlhf.tasks.demo import preset
from ppo_rlhf.tasks.report import excludes_zero, interval
from ppo_rlhf.utils.files import atomic_write_text
from ppo_rlhf.utils.lock import hold
from ppo_rlhf.utils.paths import check_model_name
from ppo_rlhf.utils.signals import by_sigterm

if TYPE_CHECKING:
    from matplotlib.figure import Figure

VARIANTS: dict[str, dict[str, Any]] = {
    "ppo": {"advantage_estimator": "gae", "critic_warmup_iterations": 0, "turn_level_gae": False},
    "ppo-warmup": {"advantage_estimator": "gae", "critic_warmup_iterations": 3, "turn_level_gae": False},
    "ppo-turn": {"advantage_estimator": "gae", "critic_warmup_iterations": 0, "turn_level_gae": True},
    "ev-gated": {"advantage_estimator": "ev-gated", "critic_warmup_iterations": 0, "turn_level_gae": False},
    "rloo": {"advantage_estimator": "rloo", "critic_warmup_iterations": 0, "turn_level_gae": False},
    "grpo": {"advantage_estimator": "grpo", "critic_warmup_iterations": 0, "turn_level_gae": False},
}
# without --horizons (with them: horizons.HORIZON_VARIANTS)
DEFAULT_VARIANTS = ("ppo", "ppo-warmup", "rloo", "grpo")
GROUP_SIZE = 2
# what the comparison sets for every variant: a flag naming one of these is refused with --task
SET_HERE = ("advantage_estimator", "critic_warmup_iterations", "turn_level_gae", "group_size", "prompts", "overwrite")
# held-out evaluation: `ppo-rlhf task evaluate`'s sample batch
EVAL_BATCH = 32


def default_checkpoints(iterations: int) -> str:
    """Every 10th iteration and the last: "10,20,30" for 30 iterations, "2" for 2."""
    return ",".join(str(i) for i in sorted({*range(10, iterations + 1, 10), iterations}))


def checked_checkpoints(text: str, cfg: TrainConfig) -> str:
    """--checkpoints as "10,20,30", each an iteration the runs will have saved (checked before any training)."""
    try:
        wanted = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        wanted = []
    require(bool(wanted), f"--checkpoints must be iterations like 10,20,30; got {text!r}")
    saved = [i for i in wanted if 1 <= i <= cfg.iterations and (i % cfg.checkpoint_every == 0 or i == cfg.iterations)]
    absent = [str(i) for i in wanted if i not in saved]
    require(not absent, f"--checkpoints {','.join(absent)}: the runs save a checkpoint every {cfg.checkpoint_every} "
                        f"iterations and at the last ({cfg.iterations})")
    return ",".join(map(str, wanted))


def variant_configs(base: dict[str, Any], overrides: dict[str, Any], out: Path, variants: list[str]
                    ) -> dict[str, TrainConfig]:
    """One TrainConfig per variant: the base, the overrides, the variant's settings, group_size 2, its files in OUT."""
    unknown = [name for name in variants if name not in VARIANTS]
    require(not unknown and len(set(variants)) == len(variants) and bool(variants),
            f"--variants must be distinct names from {', '.join(VARIANTS)}; got {','.join(variants)}")
    configs = {name: build_config(TrainConfig, base, overrides, VARIANTS[name],
                                  {"group_size": GROUP_SIZE, "prompts": str(out / "data" / "train.jsonl"),
                                   "out": str(out / name)})
               for name in variants}
    for cfg in configs.values():
        cfg.require_inputs(flags=True)
        check_model_name(cfg.policy_model)  # before hours of training, and before torch loads
    return configs


def train_in_process(cfg: TrainConfig, config_file: Path, continuing: bool) -> dict[str, Any]:
    """`python -m ppo_rlhf train` of one variant in a child process (its output passes through); returns and writes
    to RUN_DIR/process.json its wall seconds, peak resident memory (MiB) and the CPU's matrix flags. A killed variant
    (`continuing`, its run directory started) continues from its latest checkpoint: then both numbers are of the
    continuation only."""
    run_dir = Path(cfg.out)
    atomic_write_text(config_file, to_yaml(cfg))
    if continuing and (run_dir / "config.yaml").is_file():
        argv = ["train", "--resume", str(run_dir)]
    else:
        shutil.rmtree(run_dir, ignore_errors=True)  # a run with other settings, or one killed while loading
        argv = ["train", "--config", str(config_file)]
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "ppo_rlhf", *argv])
    try:
        _, status, usage = os.wait4(child.pid, 0)
    except KeyboardInterrupt as error:  # Ctrl-C reached the child too: it writes its checkpoint and ends
        if by_sigterm(error):  # SIGTERM reached this process only: the child keeps its work as it would on Ctrl-C
            child.send_signal(signal.SIGTERM)
        child.wait()
        raise
    child.returncode = code = os.waitstatus_to_exitcode(status)  # (Popen itself did not see it end)
    if code != 0:
        raise RunError(f"training {run_dir.name} ended with exit code {code} (its messages are above)")
    # ru_maxrss is in KiB on Linux (bytes on macOS)
    peak = usage.ru_maxrss / (2**20 if sys.platform == "darwin" else 2**10)
    from ppo_rlhf.models.precision import cpu_matrix_flags  # lazy: torch

    measured = {"wall_s": round(time.perf_counter() - start, 1), "peak_rss_mib": round(peak, 1),
                "continued": bool(continuing), "cpu_flags": cpu_matrix_flags()}  # machines differ between sittings
    atomic_write_text(run_dir / "process.json", json.dumps(measured, indent=1) + "\n")
    return measured


def compare_task(task: str, out: str | Path, base: dict[str, Any], overrides: dict[str, Any] | None = None,
                 checkpoints: str | None = None, n_heldout: int | None = 200, replies_per_prompt: int = 1,
                 seed: int = 1234, variants: list[str] | None = None) -> dict[str, Any]:
    """Train every variant (its own process), evaluate start and checkpoints, write compare.txt/json/png; returns
    the comparison (`summarize`)."""
    check_task(task)
    out = Path(out).resolve()
    configs = variant_configs(base, overrides or {}, out, variants or list(DEFAULT_VARIANTS))
    first = next(iter(configs.values()))
    checkpoints = checked_checkpoints(checkpoints or default_checkpoints(first.iterations), first)
    with hold(out, "compare folder"):
        out.mkdir(parents=True, exist_ok=True)
        stages = Stages(out)
        data = out / "data"
        data_key = stages.run("data", {"task": task}, [], data / "heldout.jsonl",
                              lambda _: write_task(task, data, seed=0, overwrite=True))
        keys = []
        for name, cfg in configs.items():
            settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("out", "prompts", "device")}
            final = Path(cfg.out) / "checkpoints" / f"iter_{cfg.iterations:06d}"

            def work(continuing: bool, cfg: TrainConfig = cfg, name: str = name) -> None:
                cfg.check_files()
                train_in_process(cfg, out / "configs" / f"{name}.yaml", continuing)

            keys.append(stages.run(f"train {name}", settings, [data_key], final, work))
        eval_file = out / "evaluation" / "task_eval.json"

        def evaluate(_: bool) -> None:
            from ppo_rlhf.tasks.evaluate import evaluate_task_runs  # lazy: torch

            result = evaluate_task_runs([cfg.out for cfg in configs.values()], task, n_heldout, replies_per_prompt,
                                        checkpoints, seed, EVAL_BATCH, first.device)
            atomic_write_text(eval_file, json.dumps(result, indent=1, ensure_ascii=False) + "\n")

        stages.run("evaluation", {"n_heldout": n_heldout, "replies_per_prompt": replies_per_prompt, "seed": seed,
                                  "checkpoints": checkpoints, "batch_size": EVAL_BATCH}, keys, eval_file, evaluate)
        evaluation = json.loads(eval_file.read_text())
        runs = {name: read_run(Path(cfg.out), cfg.batch_size) for name, cfg in configs.items()}
        result = summarize(evaluation, runs)
        result["sentence"] = compare_sentence(result["variants"], result["best"], result["differences"])
        table = compare_table(result) + "\n\n" + result["sentence"] + "\n"
        atomic_write_text(out / "compare.txt", table)
        atomic_write_text(out / "compare.json", json.dumps({"task": task, **result}, indent=1) + "\n")
        compare_figure(result["variants"], task).savefig(out / "compare.png", dpi=100)
        print(stages.total_line())
    return {**result, "table": table}


# ---------------------------------------------------------------- the numbers


def read_run(run_dir: Path, batch_size: int) -> dict[str, Any]:
    """What a variant's run measured: its process (process.json), seconds per iteration and cumulative sampled reply
    tokens after each iteration (from history.jsonl: mean reply length x replies per iteration; in a multi-turn run the
    policy's tokens only)."""
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines() if line.strip()]
    process = json.loads((run_dir / "process.json").read_text())
    # a multi-turn run's len counts the observations too: only the policy's share of it was sampled
    tokens = np.cumsum([row["len"] * (1 - row.get("masked_share", 0.0)) * batch_size for row in history])
    return {**process, "seconds_per_iteration": float(np.mean([row["time_total"] for row in history])),
            "tokens_after": {int(row["iteration"]) + 1: float(t) for row, t in zip(history, tokens)}}


def summarize(evaluation: dict[str, Any], runs: dict[str, dict[str, Any]], n_boot: int = 10000
              ) -> dict[str, Any]:
    """Per variant: its curve (start and each evaluated checkpoint: iteration, sampled tokens, accuracy), final
    accuracy and change, the process numbers; the best variant by final accuracy, and every other variant's paired
    difference from it (its final replies minus the best's, problems resampled)."""
    summary, records = evaluation["summary"], evaluation["records"]
    start = summary[0]
    variants: dict[str, dict[str, Any]] = {}
    for name, run in runs.items():
        points = sorted((s for s in summary if s["run"] == name), key=lambda s: s["iteration"])
        require(bool(points), f"the evaluation has no checkpoint of {name}")
        curve = [{"iteration": 0, "tokens": 0.0, "accuracy": start["accuracy"]}]
        curve += [{"iteration": s["iteration"], "tokens": run["tokens_after"][s["iteration"]],
                   "accuracy": s["accuracy"]} for s in points]
        last = points[-1]
        variants[name] = {"model": last["model"], "iteration": last["iteration"], "accuracy": last["accuracy"],
                          "accuracy_change": last["accuracy_change"], "kl": last["kl"], "curve": curve,
                          "sampled_tokens": max(run["tokens_after"].values()),
                          **{key: run[key] for key in ("seconds_per_iteration", "peak_rss_mib", "wall_s",
                                                       "continued")}}
    best = max(variants, key=lambda name: variants[name]["accuracy"]["mean"])
    differences = {name: paired_accuracy_difference(records, variant["model"], variants[best]["model"], n_boot)
                   for name, variant in variants.items() if name != best}
    return {"start": {"accuracy": start["accuracy"]}, "problems": start["problems"], "variants": variants,
            "best": best, "differences": differences}


def paired_accuracy_difference(records: list[dict[str, Any]], model: str, reference: str, n_boot: int = 10000
                               ) -> dict[str, float]:
    """`model`'s exact match minus `reference`'s on the same held-out replies of one `ppo-rlhf task evaluate`
    (its records: model, prompt_index, reply_index, correct), with its 95% interval, problems resampled
    (study.stats.paired_bootstrap)."""
    from ppo_rlhf.study.stats import paired_bootstrap

    def correct(name: str) -> dict[tuple[int, int], float]:
        return {(r["prompt_index"], r["reply_index"]): float(r["correct"]) for r in records if r["model"] == name}

    ours, theirs = correct(model), correct(reference)
    keys = sorted(theirs)
    mean, lo, hi = paired_bootstrap([ours[k] - theirs[k] for k in keys], [k[0] for k in keys], n_boot=n_boot)
    return {"mean": mean, "lo": lo, "hi": hi}


def compare_sentence(variants: dict[str, dict], best: str, differences: dict[str, dict]) -> str:
    """Which variant had the highest final accuracy, and each other's paired difference from it with its 95% interval
    and whether that excludes zero."""
    tied = [name for name in differences if variants[name]["accuracy"]["mean"] == variants[best]["accuracy"]["mean"]]
    who = f"{best} had" if not tied else f"{', '.join([best, *tied[:-1]])} and {tied[-1]} tied for"
    text = (f"{who} the highest final held-out accuracy, {interval(variants[best]['accuracy'])} after "
            f"{variants[best]['iteration']} iterations. ")
    parts = [f"{name} {interval(d, signed=True)} points ({'excludes' if excludes_zero(d) else 'includes'} zero)"
             for name, d in differences.items()]
    if not parts:
        return text.strip()
    text += f"Paired differences from {best} (final accuracy minus {best}'s, 95% interval over problems): "
    text += "; ".join(parts) + ". "
    apart = [name for name, d in differences.items() if excludes_zero(d)]
    if not apart:
        return text + "No difference excludes zero: on these problems no variant is shown to beat another."
    if len(apart) == len(differences):
        return text + f"Every difference excludes zero: {best} did better than each of the others."
    same = [name for name in differences if name not in apart]
    return (text + f"{best} did better than {', '.join(apart)}; {', '.join(same)} cannot be told apart from it on "
            "these problems.")


def compare_table(result: dict[str, Any]) -> str:
    header = ["variant", "final accuracy [95%]", "change, points [95%]", f"vs {result['best']}, points [95%]",
              "s/iteration", "peak RSS MiB", "sampled tokens", "wall s"]
    rows = [["start", interval(result["start"]["accuracy"]), "", "", "", "", "0", ""]]
    for name, v in result["variants"].items():
        difference = result["differences"].get(name)
        rows.append([name, interval(v["accuracy"]), interval(v["accuracy_change"], signed=True),
                     "" if difference is None else interval(difference, signed=True),
                     f"{v['seconds_per_iteration']:.1f}", f"{v['peak_rss_mib']:.0f}", f"{v['sampled_tokens']:.0f}",
                     f"{v['wall_s']:.0f}" + (" (continued)" if v["continued"] else "")])
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *rows]]
    return "\n".join(lines) + (f"\n({result['problems']} held-out problems; peak RSS: the training process's host "
                               "memory; sampled tokens: reply tokens sampled in training, the critic warm-up's "
                               "included, the reward normalisation's (the same for every variant) not)")


def compare_figure(variants: dict[str, dict], task: str) -> Figure:
    """Held-out accuracy against cumulative sampled reply tokens, one curve and 95% band per variant."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    from ppo_rlhf.study.report import run_style

    figure = Figure(figsize=(7.5, 4.6), layout="constrained")
    axis = figure.subplots()
    for k, (name, variant) in enumerate(variants.items()):
        x = [point["tokens"] for point in variant["curve"]]
        accuracy = [point["accuracy"] for point in variant["curve"]]
        line = axis.plot(x, [a["mean"] for a in accuracy], label=name, **run_style(k))[0]
        axis.fill_between(x, [a["lo"] for a in accuracy], [a["hi"] for a in accuracy], alpha=0.12,
                          color=line.get_color())
    axis.set_xlabel("reply tokens sampled in training (cumulative)")
    axis.set_ylabel(f"held-out {task} exact match")
    axis.set_title("Held-out accuracy at equal replies sampled per iteration (bands: 95% intervals)", fontsize=10)
    axis.set_ylim(-0.04, 1.04)
    axis.yaxis.set_major_formatter(PercentFormatter(1.0))
    axis.grid(alpha=0.3)
    axis.legend(title="variant", fontsize=9, title_fontsize=9)
    return figure


# ---------------------------------------------------------------- command line


def task_arguments(args: argparse.Namespace) -> tuple[dict[str, Any], list[str] | None, int | None]:
    """`compare --task`'s arguments, checked (with or without --horizons): (the TrainConfig flags given, which
    override the preset for every variant; --variants; the held-out problems, None for all)."""
    names = set(TrainConfig.__dataclass_fields__)
    given = {k: v for k, v in vars(args).items() if k in names}
    refused = [flag for flag, value in (("--eval-prompts", args.eval_prompts), ("--gold", args.gold),
                                        ("--estimators", args.estimators)) if value is not None]
    refused += ["--" + name.replace("_", "-") for name in SET_HERE if name in given]
    require(not refused, f"{', '.join(refused)}: no meaning with --task (it sets each variant's estimator, warm-up and "
                         "group size, writes the prompts, scores held-out problems exactly, and re-runs a stage whose "
                         "settings changed)")
    variants = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants else None
    n_heldout = 200 if args.heldout is None else args.heldout or None  # 0: every held-out problem
    return given, variants, n_heldout


def run(args: argparse.Namespace) -> int:
    """`ppo-rlhf compare --task` (the CLI hands the compare command here when --task is given, and to
    tasks/horizons.py when --horizons is; its parser is `ppo_rlhf.study.compare`'s)."""
    given, variants, n_heldout = task_arguments(args)
    horizon_only = [flag for flag, value in (("--seeds", args.seeds), ("--json-out", args.json_out),
                                             ("--screen", args.screen), ("--archive", args.archive))
                    if value is not None]
    require(not horizon_only, f"{', '.join(horizon_only)}: only with --horizons")
    base = read_yaml(args.config) if args.config else preset(args.task)
    out = given.pop("out", f"runs/compare-{args.task}")
    result = compare_task(args.task, out, base, given, args.checkpoints, n_heldout,
                          args.replies_per_prompt or 1, args.eval_seed, variants)
    print(result["table"], end="")
    print(f"plot: {Path(out) / 'compare.png'}")
    return 0

