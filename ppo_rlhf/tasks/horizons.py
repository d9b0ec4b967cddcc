"""`ppo-rlhf compare --task NAME --horizons 2,4,8 --seeds 3`: when is the critic worth its cost? Every variant
(default: ppo, ppo-turn, ev-gated, rloo, grpo; `compare.VARIANTS`) trains `--seeds` whole runs at every horizon, each
in its own process, and the runs of a horizon answer the same held-out problems.

A horizon is a task instance named NAME-H (`key-door` at horizon 8 is the task `key-door-8` of `ppo-rlhf task
list`), with its own data, preset and checker; a task with no such instances is refused with --horizons. Seed k of
every variant trains with seed + k (`seed` of the preset or --seed), so seed k of two variants draws the same prompts:
the comparison is paired over seeds as well as problems.

Layout, under OUT (default runs/compare-NAME-horizons):

  hH/data/                       the instance's training and held-out problems (`write_task`)
  hH/runs/VARIANT_sK/            run K of VARIANT (its config.yaml, history.jsonl, checkpoints, process.json)
  hH/evaluation/VARIANT_sK.json  its --checkpoints' records on the held-out problems (start.json: the start model's)
  hH/evaluation/task_eval.json   all of them put together, with each model's summary
  screen/chosen.json             with --screen: each variant's settings chosen on the training instances
                                 (`ppo_rlhf.tasks.screen`), written before any held-out run starts
  critic_horizon.html, .png      the report: held-out success against sampled tokens per horizon (one curve per
                                 variant, 95% bands over seeds and problems), success at equal tokens by horizon, the
                                 best critic variant minus the best critic-free one with the crossover horizon and the
                                 critic's explained variance, and the runs' settings as their config.yaml saved them
  critic_horizon.json            the schema of docs/multi-turn.md (--json-out to write it elsewhere)

Every run (trained, then evaluated), the start model's evaluation and the screen are stages (`demo.Stages`,
OUT/stages.json): a killed comparison run again with the same command skips the finished runs and continues the one
that was running from its latest checkpoint; the report is written again from the stored results every time. With
--archive DIR the finished stages are also kept in DIR, a few small files each (`tasks.horizon_archive`), and a
comparison on another machine with the same DIR starts from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from ppo_rlhf.config import build_config, read_yaml
from ppo_rlhf.errors import require
from ppo_rlhf.ppo.train_config import CRITIC_ESTIMATORS, TrainConfig
from ppo_rlhf.study.demo import Stages
from ppo_rlhf.tasks.arithmetic import TASKS, check_task, write_task
from ppo_rlhf.tasks.compare import (
    EVAL_BATCH,
    GROUP_SIZE,
    VARIANTS,
    checked_checkpoints,
    default_checkpoints,
    read_run,
    task_arguments,
    train_in_process,
)
from ppo_rlhf.tasks.comparison import Comparison
from ppo_rlhf.tasks.demo import preset
from ppo_rlhf.tasks.horizon_archive import keep, restore
from ppo_rlhf.tasks.horizon_stats import (
    N_BOOT,
    crossover_horizon,
    mean_explained_variance,
    seed_problem_interval,
    success_at_tokens,
    success_table,
)
from ppo_rlhf.utils.files import atomic_write_text
from ppo_rlhf.utils.lock import hold
from ppo_rlhf.utils.paths import check_model_name

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HORIZON_VARIANTS = ("ppo", "ppo-turn", "ev-gated", "rloo", "grpo")
"""The default variants of a horizon comparison: token- and turn-level GAE, the EV gate, and two critic-free ones."""
BAND_BOOT = 2000  # bootstrap draws of each curve point's band (the table's and the JSON's intervals use N_BOOT)


def parse_horizons(text: str) -> list[int]:
    """--horizons "2,4,8" as [2, 4, 8] (distinct positive integers, sorted)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    require(bool(parts) and all(part.isdigit() and int(part) > 0 for part in parts),
            f"--horizons must be positive integers like 2,4,8; got {text!r}")
    return sorted({int(part) for part in parts})


def horizon_task(task: str, horizon: int) -> str:
    """The task instance of `task` at `horizon`: NAME-H, one of `ppo-rlhf task list`'s tasks."""
    known = {int(name[len(task) + 1:]) for name in TASKS if re.fullmatch(re.escape(task) + r"-\d+", name)}
    require(bool(known), f"--horizons: task {task} has no horizon (a task with one lists instances NAME-H in "
                         "`ppo-rlhf task list`)")
    require(horizon in known, f"--horizons {horizon}: {task} has horizons {', '.join(map(str, sorted(known)))}")
    return check_task(f"{task}-{horizon}")


def run_label(variant: str, seed_index: int) -> str:
    """A run's folder name, and its name in the evaluation: "ppo-turn_s2" (variant names have no "_")."""
    return f"{variant}_s{seed_index}"


def plan(task: str, out: Path, base_for: Any, overrides: dict[str, Any], horizons: list[int], seeds: int,
         variants: list[str], chosen: dict[int, dict[str, dict[str, Any]]] | None = None) -> Comparison:
    """Every run's TrainConfig: the instance's base (`base_for(instance)`), the flags, the variant's settings, the
    screen's chosen settings (if any), group_size 2, seed + k, its prompts and folder in OUT/hH."""
    unknown = [name for name in variants if name not in VARIANTS]
    require(not unknown and len(set(variants)) == len(variants) and bool(variants),
            f"--variants must be distinct names from {', '.join(VARIANTS)}; got {','.join(variants)}")
    require(seeds >= 1, f"--seeds must be at least 1; got {seeds}")
    instances = {h: horizon_task(task, h) for h in horizons}
    configs: dict[int, dict[tuple[str, int], TrainConfig]] = {}
    for h, instance in instances.items():
        base = base_for(instance)
        first_seed = int(overrides.get("seed", base.get("seed", 1)))
        configs[h] = {}
        for k in range(seeds):  # seed 0 of every variant first: a comparison stopped part-way is balanced
            for variant in variants:
                tuned = (chosen or {}).get(h, {}).get(variant, {})
                cfg = build_config(TrainConfig, base, overrides, VARIANTS[variant], tuned,
                                   {"group_size": GROUP_SIZE, "seed": first_seed + k,
                                    "prompts": str(out / f"h{h}" / "data" / "train.jsonl"),
                                    "out": str(out / f"h{h}" / "runs" / run_label(variant, k))})
                cfg.require_inputs()
                configs[h][variant, k] = cfg
    check_model_name(next(iter(configs[horizons[0]].values())).policy_model)  # before hours of training
    return Comparison(task, out, horizons, seeds, variants, instances, configs)


def compare_horizons(task: str, out: str | Path, base_for: Any, overrides: dict[str, Any], horizons: list[int],
                     seeds: int = 3, variants: list[str] | None = None, checkpoints: str | None = None,
                     n_heldout: int | None = 200, replies_per_prompt: int = 1, eval_seed: int = 1234,
                     json_out: str | Path | None = None, screen: bool = False,
                     archive: str | Path | None = None) -> dict[str, Any]:
    """Train and evaluate every (horizon, variant, seed) (`--screen`: after choosing each variant's settings on the
    training instances), write the report and the JSON; returns the JSON's content. `archive`: a folder that keeps
    every finished run and evaluation (`tasks.horizon_archive`), and from which those not done here are taken."""
    out = Path(out).resolve()
    variants = variants or list(HORIZON_VARIANTS)
    comparison = plan(task, out, base_for, overrides, horizons, seeds, variants)  # every check before any work
    first = next(iter(comparison.configs[horizons[0]].values()))
    checkpoints = checked_checkpoints(checkpoints or default_checkpoints(first.iterations), first)
    json_path = Path(json_out) if json_out else out / "critic_horizon.json"
    with hold(out, "compare folder"):
        out.mkdir(parents=True, exist_ok=True)
        stages = Stages(out)
        if archive is not None:
            archive = Path(archive).resolve()
            restored = restore(stages, out, archive)
            print(f"taken from the archive {archive}: {', '.join(restored) if restored else 'nothing new'}")
        data_keys = {}
        for h, instance in comparison.instances.items():
            data = out / f"h{h}" / "data"

            def write(_: bool, instance: str = instance, data: Path = data) -> None:
                write_task(instance, data, seed=0, overwrite=True)

            data_keys[h] = stages.run(f"data h{h}", {"task": instance}, [], data / "heldout.jsonl", write)
        if screen:
            from ppo_rlhf.tasks.screen import screen_variants

            chosen = screen_variants(comparison, stages, data_keys, base_for, overrides)
            comparison = plan(task, out, base_for, overrides, horizons, seeds, variants, chosen)
        for h in horizons:
            run_horizon(comparison, h, stages, data_keys[h], checkpoints, n_heldout, replies_per_prompt, eval_seed,
                        archive)
        result = write_report(comparison, json_path)
        print(stages.total_line())
    return result


def run_horizon(comparison: Comparison, h: int, stages: Stages, data_key: str, checkpoints: str,
                n_heldout: int | None, replies_per_prompt: int, eval_seed: int, archive: Path | None = None) -> None:
    """Every run of horizon h in one stage each: trained, then its checkpoints evaluated on the held-out problems (a
    run's records are its result: its checkpoints are not read again); the start model in a stage of its own; then
    evaluation/task_eval.json put together from them. With `archive`, each finished stage is kept there too."""
    folder = comparison.out / f"h{h}"
    evaluation = {"n_heldout": n_heldout, "replies_per_prompt": replies_per_prompt, "seed": eval_seed,
                  "checkpoints": checkpoints, "batch_size": EVAL_BATCH}
    configs = list(comparison.configs[h].values())

    def evaluated(run_dirs: list[str | Path], models: str) -> dict[str, Any]:
        from ppo_rlhf.tasks.evaluate import evaluate_task_runs  # lazy: torch

        return evaluate_task_runs(run_dirs, comparison.instances[h], n_heldout, replies_per_prompt, checkpoints,
                                  eval_seed, EVAL_BATCH, configs[0].device, models=models)

    def kept(name: str, files: list[Path]) -> None:
        if archive is not None:
            keep(stages, name, comparison.out, archive, [path.relative_to(comparison.out) for path in files])

    for (variant, k), cfg in comparison.configs[h].items():
        label, run_dir = run_label(variant, k), Path(cfg.out)
        settings = {key: v for key, v in dataclasses.asdict(cfg).items() if key not in ("out", "prompts", "device")}
        records = folder / "evaluation" / f"{label}.json"

        def work(continuing: bool, cfg: TrainConfig = cfg, label: str = label, records: Path = records) -> None:
            trained = (Path(cfg.out) / "checkpoints" / f"iter_{cfg.iterations:06d}").is_dir()
            if not (continuing and trained and (Path(cfg.out) / "process.json").is_file()):  # else: killed in eval
                cfg.check_files()
                train_in_process(cfg, folder / "configs" / f"{label}.yaml", continuing)
            write_json(records, evaluated([cfg.out], "checkpoints"))

        stages.run(f"run h{h} {label}", {**settings, "evaluation": evaluation}, [data_key], records, work)
        kept(f"run h{h} {label}", [run_dir / name for name in ("config.yaml", "history.jsonl", "process.json")]
             + [records])
    start = folder / "evaluation" / "start.json"
    stages.run(f"evaluate h{h} start", {**evaluation, "settings": start_settings(configs[0])}, [data_key], start,
               lambda _: write_json(start, evaluated([configs[0].out], "start")))
    kept(f"evaluate h{h} start", [start])
    write_json(folder / "evaluation" / "task_eval.json", joined_evaluation(start, [
        folder / "evaluation" / f"{run_label(variant, k)}.json" for variant, k in comparison.configs[h]]))


def start_settings(cfg: TrainConfig) -> dict[str, Any]:
    """The start model's evaluation settings every run shares (`evaluate.SHARED`, `EPISODE_SHARED`)."""
    from ppo_rlhf.tasks.evaluate import EPISODE_SHARED, SHARED

    return {key: getattr(cfg, key) for key in (*SHARED, *EPISODE_SHARED)}


def joined_evaluation(start: Path, parts: list[Path]) -> dict[str, Any]:
    """The start model's records and every run's, as one evaluation of them all ({"settings", "summary",
    "records"}; the settings name every run)."""
    from ppo_rlhf.tasks.evaluate import summarize_task

    first = json.loads(start.read_text())
    records, runs = list(first["records"]), dict[str, str]()
    for part in parts:
        evaluation = json.loads(part.read_text())
        records += evaluation["records"]
        runs |= evaluation["settings"]["runs"]
    return {"settings": {**first["settings"], "runs": runs}, "summary": summarize_task(records), "records": records}


def write_json(path: Path, content: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(content, indent=1, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------- the numbers, from the stored results


def saved_config(run_dir: Path) -> dict[str, Any]:
    """The settings a run trained with, as it saved them (config.yaml), not as this command would set them now."""
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def horizon_numbers(comparison: Comparison, h: int) -> dict[str, Any]:
    """One horizon's results: per run its curve (tokens, success) and final numbers; per variant its pooled
    success (seeds and problems) with the band of each evaluated checkpoint, and its critic's mean explained
    variance; the best critic variant minus the best critic-free one (paired over seeds and problems)."""
    folder = comparison.out / f"h{h}"
    evaluation = json.loads((folder / "evaluation" / "task_eval.json").read_text())
    records, summary = evaluation["records"], evaluation["summary"]
    start = summary[0]
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for (variant, k), cfg in comparison.configs[h].items():
        run_dir = Path(cfg.out)
        config = saved_config(run_dir)
        measured = read_run(run_dir, int(config["batch_size"]))
        points = sorted((s for s in summary if s["run"] == run_label(variant, k)), key=lambda s: s["iteration"])
        require(bool(points), f"the evaluation of horizon {h} has no checkpoint of {run_label(variant, k)}")
        history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines() if line.strip()]
        runs[variant, k] = {"config": config, "history": history, "points": points,
                            "curve": [(0.0, start["accuracy"]["mean"])] + [
                                (measured["tokens_after"][p["iteration"]], p["accuracy"]["mean"]) for p in points],
                            "sampled_tokens": max(measured["tokens_after"].values()),
                            "heldout_success": points[-1]["accuracy"]["mean"]}
    seeds = range(comparison.seeds)
    iterations = [p["iteration"] for p in runs[comparison.variants[0], 0]["points"]]
    variants: dict[str, dict[str, Any]] = {}
    for variant in comparison.variants:
        models = {i: [f"{run_label(variant, k)} step {i}" for k in seeds] for i in iterations}
        band = [{"tokens": 0.0, **seed_problem_interval(success_table(records, ["start"]), BAND_BOOT)}]
        band += [{"tokens": float(np.mean([runs[variant, k]["curve"][n + 1][0] for k in seeds])),
                  **seed_problem_interval(success_table(records, models[i]), BAND_BOOT)}
                 for n, i in enumerate(iterations)]
        variants[variant] = {
            "critic": runs[variant, 0]["config"]["advantage_estimator"] in CRITIC_ESTIMATORS,
            "final": seed_problem_interval(success_table(records, models[iterations[-1]]), N_BOOT),
            "band": band, "models": models[iterations[-1]],
            "ev": mean_explained_variance(runs[variant, k]["history"] for k in seeds)}
    budget = min(run["sampled_tokens"] for run in runs.values())  # every run sampled at least this many tokens
    for variant, numbers in variants.items():
        at_budget = [success_at_tokens(runs[variant, k]["curve"], budget) for k in seeds]
        numbers["at_budget"] = {"mean": float(np.mean(at_budget)), "min": min(at_budget), "max": max(at_budget)}
    return {"horizon": h, "runs": runs, "variants": variants, "budget": budget, "start": start["accuracy"],
            "difference": best_difference(h, variants, records), "problems": start["problems"]}


def best_difference(h: int, variants: dict[str, dict[str, Any]], records: list[dict]) -> dict[str, Any] | None:
    """The best critic variant (highest pooled final success) minus the best critic-free one, in points, with its
    95% interval: the (seed k, problem p) cells of one minus the same cells of the other, resampled over seeds and
    problems, crossed."""
    critic = [name for name, v in variants.items() if v["critic"]]
    free = [name for name, v in variants.items() if not v["critic"]]
    if not critic or not free:
        return None
    best_critic = max(critic, key=lambda name: variants[name]["final"]["mean"])
    best_free = max(free, key=lambda name: variants[name]["final"]["mean"])
    cells = (success_table(records, variants[best_critic]["models"])
             - success_table(records, variants[best_free]["models"]))
    difference = seed_problem_interval(cells, N_BOOT)
    return {"horizon": h, "critic_variant": best_critic, "free_variant": best_free,
            "diff_points": round(100 * difference["mean"], 2),
            "ci95": [round(100 * difference["lo"], 2), round(100 * difference["hi"], 2)]}


def result_json(comparison: Comparison, numbers: list[dict[str, Any]]) -> dict[str, Any]:
    """The file docs/multi-turn.md describes (critic_horizon.json), exactly its keys."""
    rows = [{"horizon": n["horizon"], "variant": variant, "seed": int(run["config"]["seed"]),
             "sampled_tokens": round(run["sampled_tokens"], 1), "heldout_success": run["heldout_success"]}
            for n in numbers for (variant, _), run in n["runs"].items()]
    differences = [n["difference"] for n in numbers if n["difference"] is not None]
    return {"task": comparison.task, "horizons": comparison.horizons, "seeds": comparison.seeds, "rows": rows,
            "best_critic_minus_best_free": differences, "crossover_horizon": crossover_horizon(differences)}


def write_report(comparison: Comparison, json_path: Path) -> dict[str, Any]:
    numbers = [horizon_numbers(comparison, h) for h in comparison.horizons]
    result = result_json(comparison, numbers)
    atomic_write_text(json_path, json.dumps(result, indent=1) + "\n")
    horizon_figure(numbers, comparison.task).savefig(comparison.out / "critic_horizon.png", dpi=100)
    text = report_text(numbers, result)
    atomic_write_text(comparison.out / "critic_horizon.txt", text)
    atomic_write_text(comparison.out / "critic_horizon.html", report_html(comparison, numbers, text))
    print(text, end="")
    print(f"report: {comparison.out / 'critic_horizon.html'}; numbers: {json_path}")
    return result


# ---------------------------------------------------------------- report


def percent(c: dict[str, float]) -> str:
    return f"{100 * c['mean']:.1f}% [{100 * c['lo']:.1f}, {100 * c['hi']:.1f}]"


def report_text(numbers: list[dict[str, Any]], result: dict[str, Any]) -> str:
    """Success at equal tokens by horizon, the pooled final success, and the critic-vs-free line per horizon."""
    lines = []
    for n in numbers:
        lines.append(f"horizon {n['horizon']} ({n['problems']} held-out problems; start {percent(n['start'])}; "
                     f"equal budget: {n['budget']:.0f} sampled policy tokens, the fewest any run sampled)")
        header = ["variant", "success at equal tokens, mean [seed min, max]", "final success [95%, seeds x problems]",
                  "critic EV (mean over iterations)"]
        rows = [[name, f"{100 * v['at_budget']['mean']:.1f}% [{100 * v['at_budget']['min']:.1f}, "
                       f"{100 * v['at_budget']['max']:.1f}]", percent(v["final"]),
                 "-" if v["ev"] is None else f"{v['ev']:+.2f}"] for name, v in n["variants"].items()]
        widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header, *rows]]
        d = n["difference"]
        if d is not None:
            lines.append(f"  best critic ({d['critic_variant']}) minus best critic-free ({d['free_variant']}): "
                         f"{d['diff_points']:+.1f} points [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]")
        lines.append("")
    crossover = result["crossover_horizon"]
    lines.append("crossover horizon (shortest horizon where the best critic variant is ahead with its 95% interval "
                 f"above 0): {'none' if crossover is None else crossover}")
    return "\n".join(lines) + "\n"


SETTINGS_SHOWN = ("advantage_estimator", "turn_level_gae", "value_lr", "critic_warmup_iterations", "policy_lr",
                  "iterations", "batch_size", "group_size", "max_new_tokens", "max_turns", "seed")


def report_html(comparison: Comparison, numbers: list[dict[str, Any]], text: str) -> str:
    """The page: the figure, the tables as text, and each run's settings read from its saved config.yaml."""
    settings_rows = []
    for n in numbers:
        for (variant, k), run in n["runs"].items():
            cells = [str(n["horizon"]), variant, str(k)] + [html.escape(str(run["config"].get(key, "")))
                                                             for key in SETTINGS_SHOWN]
            settings_rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    head = "".join(f"<th>{name}</th>" for name in ("horizon", "variant", "run", *SETTINGS_SHOWN))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>critic against horizon: {comparison.task}"
            "</title></head><body>"
            f"<h1>When is the critic worth its cost? {html.escape(comparison.task)}, horizons "
            f"{', '.join(map(str, comparison.horizons))}, {comparison.seeds} seeds</h1>"
            "<img src='critic_horizon.png' alt='held-out success against sampled tokens, per horizon'>"
            f"<pre>{html.escape(text)}</pre>"
            "<p>Intervals: 95% intervals of a bootstrap over seeds and problems, crossed (every draw takes the "
            "problems once for all seeds, the seeds independently; differences paired by seed and problem). "
            "Equal tokens: each run's held-out success interpolated "
            "linearly between its evaluated checkpoints at the fewest policy tokens any run of the horizon sampled."
            "</p><h2>Settings of every run (from its config.yaml)</h2>"
            f"<table border='1' cellspacing='0'><tr>{head}</tr>{''.join(settings_rows)}</table></body></html>\n")


def horizon_figure(numbers: list[dict[str, Any]], task: str) -> Figure:
    """One panel per horizon: held-out success against sampled policy tokens, one curve per variant (pooled over
    seeds, at each checkpoint's mean tokens) with its 95% band over seeds and problems."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    from ppo_rlhf.study.report import run_style

    figure = Figure(figsize=(4.2 * len(numbers), 4.2), layout="constrained")
    axes = np.atleast_1d(figure.subplots(1, len(numbers), sharey=True))
    for axis, n in zip(axes, numbers):
        for k, (name, variant) in enumerate(n["variants"].items()):
            x = [point["tokens"] for point in variant["band"]]
            line = axis.plot(x, [p["mean"] for p in variant["band"]], label=name, **run_style(k))[0]
            axis.fill_between(x, [p["lo"] for p in variant["band"]], [p["hi"] for p in variant["band"]], alpha=0.12,
                              color=line.get_color())
        axis.set_title(f"horizon {n['horizon']}", fontsize=10)
        axis.set_xlabel("policy tokens sampled in training")
        axis.set_ylim(-0.04, 1.04)
        axis.yaxis.set_major_formatter(PercentFormatter(1.0))
        axis.grid(alpha=0.3)
    axes[0].set_ylabel(f"held-out {task} success")
    axes[-1].legend(title="variant", fontsize=8, title_fontsize=8)
    return figure


def run(args: argparse.Namespace) -> int:
    """`ppo-rlhf compare --task NAME --horizons H,H` (the CLI hands the compare command here when --horizons is
    given; its parser is `ppo_rlhf.study.compare`'s, its --task arguments checked as `compare --task`'s)."""
    require(args.task is not None, "--horizons needs --task NAME (a task with instances NAME-H: ppo-rlhf task list)")
    given, variants, n_heldout = task_arguments(args)
    config = read_yaml(args.config) if args.config else None
    out = given.pop("out", f"runs/compare-{args.task}-horizons")
    compare_horizons(args.task, out, lambda instance: config or preset(instance), given, parse_horizons(args.horizons),
                     args.seeds or 3, variants, args.checkpoints, n_heldout, args.replies_per_prompt or 1,
                     args.eval_seed, args.json_out, bool(args.screen), args.archive)
    return 0
