"""`ppo-rlhf demo --task TASK`: PPO against a reward that is true by construction (a `ppo_rlhf.tasks.arithmetic`
level, or the multi-turn calc-steps with its calculator tool), measured on held-out problems, end to end.

  1. data        the level's training and held-out problems (`tasks.write_task`) in OUT/data
  2. ppo         the task's preset exactly as it is (its prompts and out pointed into OUT): configs/
                 smollm2_add_tiny.yaml for a level (SmolLM2, the exact checker plus the small format term, 30
                 iterations, a checkpoint every 5), configs/smollm2_calc_steps.yaml for calc-steps (episodes with the
                 calc tool)
  3. evaluation  the start model and every checkpoint on 200 held-out problems, one reply (calc-steps: one episode)
                 each, with the settings of `ppo-rlhf task evaluate` (sampling seed 1234, 32 replies at once):
                 OUT/eval/task_eval.json
  4. report      OUT/report/report.html and its PNGs (`ppo_rlhf.tasks.report`): the result in words from the numbers,
                 accuracy against iteration and against KL, finished share and length (calc-steps: turns and tool
                 use), examples before and after, a table of every model, the stage times

The stages are the offline demo's (`demo.Stages`): each is keyed by its settings and the stages before it
(OUT/stages.json), a finished one is skipped when its key is unchanged, a killed one continues (PPO from its latest
checkpoint), and OUT/timings.json holds each stage's seconds. OUT is locked meanwhile (lock.py).

The flags that apply with --task: --out (default runs/demo-TASK), --quick (a smoke run of a few minutes), --model
(the policy; default the preset's), --seed (the PPO run's; the problems and the evaluation's sampling stay fixed,
so every demo measures the same held-out problems), --device, --dtype and --iterations (checkpoints stay every 5).
Every other demo flag belongs to the offline study and is refused.

The preset is read from the repository's configs/ folder (one source of truth: the same file `ppo-rlhf train
--config` runs); it is not part of the wheel, so the task demo runs from a clone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from ppo_rlhf.config import build_config, read_yaml
from ppo_rlhf.errors import require
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.study.demo import Stages, given_settings
from ppo_rlhf.tasks import calc_steps, guess_number, horizon, key_door
from ppo_rlhf.tasks.arithmetic import check_task, write_task
from ppo_rlhf.utils.files import atomic_write_text
from ppo_rlhf.utils.lock import hold
from ppo_rlhf.utils.paths import check_model_name

PRESET = Path(__file__).resolve().parents[2] / "configs" / "smollm2_add_tiny.yaml"
PRESETS = {calc_steps.NAME: PRESET.with_name("smollm2_calc_steps.yaml")}  # a task's own preset; the levels': PRESET
# an environment task's family preset, the same at every horizon (its caps fit the longest)
FAMILY_PRESETS = {key_door.NAME: PRESET.with_name("smollm2_key_door.yaml"),
                  guess_number.NAME: PRESET.with_name("smollm2_guess.yaml")}

# The smoke run: a few problems, two iterations of a small batch at a short cap (one of them the critic's warm-up,
# one moves the policy), a checkpoint after each; minutes on SmolLM2 and a CPU.
QUICK = dict(iterations=2, batch_size=4, minibatch_size=2, max_new_tokens=32, reward_norm_samples=8,
             critic_warmup_iterations=1, checkpoint_every=1)
QUICK_PROBLEMS = dict(train=32, heldout=20)  # the full demo writes every problem of the level
HELDOUT = 200  # held-out problems the evaluation scores (QUICK_PROBLEMS["heldout"] in the smoke run)
# `ppo-rlhf task evaluate`'s defaults, so that the demo's evaluation of the preset reproduces bench/HISTORY.md's table
EVALUATION: dict[str, Any] = dict(replies_per_prompt=1, seed=1234, batch_size=32, checkpoints="all")

# demo flags that mean something here, and the TrainConfig field each of the others sets
APPLIES = ("task", "out", "quick", "model", "seed", "device", "dtype", "iterations", "threads")
TRAIN_FIELD = {"model": "policy_model", "seed": "seed", "device": "device", "dtype": "dtype",
               "iterations": "iterations", "threads": "threads"}


def preset_path(task: str = "add-tiny") -> Path:
    """The task's preset file: its own (PRESETS), its family's (FAMILY_PRESETS: key-door-8), else
    configs/smollm2_add_tiny.yaml."""
    found = horizon.parse(task)
    return FAMILY_PRESETS[found[0].NAME] if found is not None else PRESETS.get(task, PRESET)


def preset(task: str = "add-tiny") -> dict[str, Any]:
    """The settings of the task's preset."""
    path = preset_path(task)
    require(path.is_file(), f"the task preset {path} is missing: it ships with the repository, not the wheel; "
                            "run the task demo from a clone")
    return read_yaml(path)


def run(args: argparse.Namespace) -> int:
    """`ppo-rlhf demo --task ...` (the CLI hands the demo command here when --task is given; its parser is
    `ppo_rlhf.study.demo`'s)."""
    return run_task_demo(given_settings(args))


def run_task_demo(given: dict[str, Any]) -> int:
    """`ppo-rlhf demo --task ...` with the demo flags that were given (defaults left out)."""
    refused = [name for name in given if name not in APPLIES]
    flags = ", ".join("--" + name.replace("_", "-") for name in refused)
    require(not refused, f"{flags} {'has' if len(refused) == 1 else 'have'} no meaning with --task (it runs "
                         f"{preset_path(given['task']).name}); with --task give only "
                         f"{', '.join('--' + name for name in APPLIES if name != 'task')}")
    task = given["task"]
    overrides = {TRAIN_FIELD[name]: value for name, value in given.items() if name in TRAIN_FIELD}
    task_demo(task, given.get("out", f"runs/demo-{task}"), bool(given.get("quick")), overrides)
    return 0


def train_config(task_out: Path, quick: bool, overrides: dict[str, Any], task: str = "add-tiny") -> TrainConfig:
    """The PPO run's config: the task's preset (the smoke run's sizes with `quick`), the overrides, its files in OUT."""
    settings, sized = preset(task), QUICK if quick else {}
    from_preset = {name: f"the preset {preset_path(task)}" for name in settings if name not in {*sized, *overrides}}
    cfg = build_config(TrainConfig, settings, sized, overrides,
                       {"prompts": str(task_out / "data" / "train.jsonl"), "out": str(task_out / "ppo")},
                       origin=from_preset)
    check_model_name(cfg.policy_model)  # a typo is named before any stage starts, and before torch loads
    return cfg


def task_demo(task: str, out: str | Path, quick: bool = False, overrides: dict[str, Any] | None = None) -> Path:
    """The task demo's four stages; returns the report folder. `overrides`: TrainConfig fields set over the preset."""
    check_task(task)
    out = Path(out).resolve()  # every path the stages save is absolute
    cfg = train_config(out, quick, overrides or {}, task)
    problems = QUICK_PROBLEMS if quick else {"train": None, "heldout": None}
    n_heldout = QUICK_PROBLEMS["heldout"] if quick else HELDOUT
    with hold(out, "demo folder"):
        out.mkdir(parents=True, exist_ok=True)
        settings_text = yaml.safe_dump({"task": task, "quick": quick, **(overrides or {})}, sort_keys=False)
        stages = Stages(out, settings_text)

        data = out / "data"
        data_key = stages.run("data", {"task": task, **problems}, [], data / "heldout.jsonl",
                              lambda _: write_task(task, data, problems["train"], problems["heldout"], seed=0,
                                                   overwrite=True))

        run_dir = Path(cfg.out)

        def ppo(continuing: bool) -> None:
            from ppo_rlhf.train import train  # lazy: torch

            cfg.check_files()
            if continuing and (run_dir / "config.yaml").is_file():
                train(cfg, resume=True)  # killed with the same key: continue from its latest checkpoint
            else:
                shutil.rmtree(run_dir, ignore_errors=True)  # a run with other settings, or one killed while loading
                train(cfg)

        # out, prompts and device say where, not what: the data key stands for the prompts
        ppo_settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("out", "prompts", "device")}
        final = run_dir / "checkpoints" / f"iter_{cfg.iterations:06d}"
        ppo_key = stages.run("ppo", ppo_settings, [data_key], final, ppo)

        eval_file = out / "eval" / "task_eval.json"

        def evaluate(_: bool) -> None:
            from ppo_rlhf.tasks.evaluate import evaluate_task_runs  # lazy: torch

            result = evaluate_task_runs([run_dir], task, n_heldout, device=cfg.device, **EVALUATION)
            atomic_write_text(eval_file, json.dumps(result, indent=1, ensure_ascii=False) + "\n")

        eval_key = stages.run("evaluation", {"n_heldout": n_heldout, **EVALUATION}, [ppo_key], eval_file, evaluate)

        from ppo_rlhf.tasks.report import write_task_report  # lazy: matplotlib

        report = out / "report"
        times = stages.timings()  # data, ppo, evaluation: the report says them (a re-run stage re-runs the report)
        stages.run("report", {"quick": quick, "times": times}, [eval_key], report / "report.html",
                   lambda _: write_task_report(eval_file, run_dir, report, times, quick))
        atomic_write_text(out / "timings.json", json.dumps(stages.timings(), indent=1))
        print(stages.total_line())
        print((report / "summary.txt").read_text(), end="")
        print(f"report: {report / 'report.html'}")
    return report
