"""The rematch's screening (bench/plans/peer_grpo_rematch.md, "Tuning budget"): each screened side's learning rate and
batch chosen on a validation slice of add-tiny's training problems, before any timed run.

    .venv/bin/python bench/peer_grpo_screen.py --dry-run --out /tmp/screen  # tiny random models, 2 cells a side, a step
    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python bench/peer_grpo_screen.py --out runs/rematch_screen
                                                               # 12 cells x 600 s and their evaluation (quiet machine)

Grid (GRID): 3 learning rates x 2 batches a side, one seed (SEED, never used by the timed runs), BUDGET_S of training
a cell, each cell run by bench/peer_grpo.py's `run_side` (its own process, ours in .venv, TRL's in bench/.venv-grpo,
the same clock), its settings over the side's own:

    ours-ppo   policy_lr = value_lr 5e-5, 1e-4, 2e-4; batch_size 16 (8 prompts x 2) and 32 (16 x 2), group_size 2
    trl-lora   learning_rate 5e-5, 1e-4, 2e-4; per_device_train_batch_size 8 (1 prompt x 8 generations) and 32
               (4 prompts x 8)

Data: the validation slice is the first VALIDATION of add-tiny's training problems in the bench's seeded order
(`problems(LEVEL, "train", VALIDATION)`, the first lines of bench/peer_grpo.py's OUT/data/train.jsonl); the cells train
on the other training problems (OUT/data/screen_train.jsonl). The held-out problems are never read: no held-out file
is written, and the evaluation asks for the training split (`ppo-rlhf task evaluate --split train`).

Score: a cell's checkpoints are at the first step past CHECKPOINT_EVERY_S and at the stop (its last two), each
answering the validation problems, EVAL_REPLIES replies at temperature 0.7, reply cap 64, fp32, one sampling seed for
every checkpoint and the start model; the cell's score is the mean exact match of its last two checkpoints. Choice:
each side's best cell; cells within TIE_POINTS of it tie, and the tie goes to the larger batch (then the higher
score). TRL's precision for the timed runs follows (the plan's "Precision"): bf16 weights if trl-lora's chosen cell
learns (LEARNS_POINTS above the start model's validation exact match), else TRL's default autocast.

OUT/screening.json holds every cell's settings, steps, checkpoints and score, the start model's score and the
choices; the lines for the plan's "Screening result" section are printed (and kept there under "paste").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from peer_grpo import LEVEL, evaluate, run_side, start_model  # noqa: E402

from ppo_rlhf.tasks.arithmetic import problems  # noqa: E402  (torch-free)

ROOT = Path(__file__).resolve().parent.parent
SEED = 11
BUDGET_S = 600.0
CHECKPOINT_EVERY_S = 300.0  # so a cell's checkpoints are its last two: past 300 s, and the stop past 600 s
VALIDATION = 150
DRY_VALIDATION = 4  # --dry-run: the first problems of the validation slice only
EVAL_REPLIES = 4
TIE_POINTS = 2.0
LEARNS_POINTS = 10.0
LEARNING_RATES = (5e-5, 1e-4, 2e-4)
GRID = {
    "ours-ppo": [{"policy_lr": lr, "value_lr": lr, "batch_size": batch, "group_size": 2}
                 for lr in LEARNING_RATES for batch in (16, 32)],
    "trl-lora": [{"learning_rate": lr, "per_device_train_batch_size": batch, "num_generations": 8}
                 for lr in LEARNING_RATES for batch in (8, 32)],
}


def replies_per_step(settings: dict) -> int:
    """Replies per optimiser step: ours' batch_size, TRL's per_device_train_batch_size (one device, no
    accumulation)."""
    return int(settings.get("batch_size", settings.get("per_device_train_batch_size", 0)))


def cells(side: str) -> list[dict]:
    """A side's screening cells: a folder name, the settings over the side's own, replies per optimiser step."""
    found = []
    for settings in GRID[side]:
        rate = settings.get("policy_lr", settings.get("learning_rate"))
        found.append({"name": f"{side}_lr{rate:.0e}_b{replies_per_step(settings)}", "side": side,
                      "settings": settings, "replies_per_step": replies_per_step(settings)})
    return found


# ------------------------------------------------------------------------------------------------- data
def validation_rows() -> list[dict]:
    """The validation slice: the first VALIDATION training problems in the bench's seeded order (what
    `evaluate_task_runs(LEVEL, VALIDATION, split="train")` answers)."""
    return problems(LEVEL, "train", VALIDATION)


def screening_training_rows() -> list[dict]:
    """Every training problem but the validation slice's."""
    held_back = {row["prompt"] for row in validation_rows()}
    return [row for row in problems(LEVEL, "train") if row["prompt"] not in held_back]


def write_screening_data(folder: Path) -> Path:
    """FOLDER/screen_train.jsonl (the cells' training problems) and FOLDER/validation.jsonl (for the record: the
    evaluation draws the same rows itself); returns the first."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, rows in (("screen_train.jsonl", screening_training_rows()), ("validation.jsonl", validation_rows())):
        (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder / "screen_train.jsonl"


# ---------------------------------------------------------------------------------------------- scoring
def cell_score(name: str, checkpoints: list[dict], summaries: dict[str, dict]) -> dict:
    """A cell's score from its checkpoints ({"iteration", "seconds", ...}, in order) and the evaluation's summaries
    by label ("NAME step N"): the mean validation exact match of its last two checkpoints (of its one, when it
    stopped after one: --dry-run)."""
    last = checkpoints[-2:]
    scored = [{"iteration": c["iteration"], "seconds": c["seconds"],
               "exact_match": summaries[f"{name} step {c['iteration']}"]["accuracy"]["mean"]} for c in last]
    return {"score": sum(c["exact_match"] for c in scored) / len(scored), "scored_checkpoints": scored}


def choose(scored: list[dict]) -> dict:
    """The side's chosen cell: of those within TIE_POINTS of the best score, the one with the most replies per
    optimiser step (fewer steps a second), then the higher score, then the earlier in the grid."""
    best = max(cell["score"] for cell in scored)
    close = [cell for cell in scored if 100 * (best - cell["score"]) <= TIE_POINTS + 1e-9]
    return max(close, key=lambda cell: (cell["replies_per_step"], cell["score"]))  # max: the first of equals


def screening_result(results: dict[str, dict], evaluation: dict) -> dict:
    """OUT/screening.json from the cells' side.json results (by cell name) and the validation evaluation."""
    summaries = {s["model"]: s for s in evaluation["summary"]}
    start = evaluation["summary"][0]["accuracy"]["mean"]  # the start model: summarize_task puts it first
    sides: dict[str, dict] = {}
    for side in GRID:
        scored = [{**cell, "steps": results[cell["name"]]["steps"], "seconds": results[cell["name"]]["seconds"],
                   **cell_score(cell["name"], results[cell["name"]]["checkpoints"], summaries)}
                  for cell in cells(side) if cell["name"] in results]
        if scored:
            chosen = choose(scored)
            sides[side] = {"cells": scored, "chosen": chosen["name"], "chosen_settings": chosen["settings"],
                           "chosen_score": chosen["score"],
                           "learns": 100 * (chosen["score"] - start) >= LEARNS_POINTS - 1e-9}
    timed_precision = screened_precision = None
    if "trl-lora" in sides:
        timed_precision = "bf16-weights" if sides["trl-lora"]["learns"] else "bf16"
        # as its cells ran (their side.json), not as this process was asked
        screened_precision = ",".join(sorted({results[c["name"]]["settings"]["precision"]
                                              for c in sides["trl-lora"]["cells"]}))
    result = {"plan": "bench/plans/peer_grpo_rematch.md", "level": LEVEL, "seed": SEED,
              "validation": {"problems": evaluation["settings"]["n_heldout"],
                             "split": evaluation["settings"]["split"], "replies": EVAL_REPLIES,
                             "temperature": evaluation["settings"]["temperature"],
                             "max_new_tokens": evaluation["settings"]["max_new_tokens"],
                             "dtype": evaluation["settings"]["dtype"], "seed": evaluation["settings"]["seed"]},
              "budget_s": BUDGET_S, "checkpoint_every_s": CHECKPOINT_EVERY_S, "tie_points": TIE_POINTS,
              "trl_precision_screened": screened_precision, "trl_precision_timed": timed_precision,
              "start_score": start, "sides": sides}
    return {**result, "paste": paste_lines(result)}


def setting_text(settings: dict) -> str:
    """"policy_lr 1e-4, batch_size 16": the plan's spelling."""
    def spelled(value) -> str:
        return f"{value:.0e}".replace("e-0", "e-") if isinstance(value, float) and value < 1e-3 else f"{value:g}"

    return ", ".join(f"{key} {spelled(value)}" for key, value in settings.items())


def paste_lines(screening: dict) -> list[str]:
    """The plan's "Screening result" section: every cell's validation score, then each side's choice."""
    validation = screening["validation"]
    trl = screening["trl_precision_screened"]
    lines = [f"Screening by `bench/peer_grpo_screen.py` (seed {screening['seed']}, {screening['budget_s']:.0f} s a "
             f"cell{f', TRL in {trl}' if trl else ''}); validation: the first {validation['problems']} "
             f"of {screening['level']}'s training problems, {validation['replies']} replies a problem at temperature "
             f"{validation['temperature']:g}, {validation['dtype']}, the mean of each cell's last two checkpoints. "
             f"Start model: {screening['start_score']:.1%}.", "",
             "| side | settings | steps | validation exact match |", "| --- | --- | --- | --- |"]
    for side, found in screening["sides"].items():
        lines += [f"| {side} | {setting_text(cell['settings'])} | {cell['steps']} | {cell['score']:.1%} |"
                  for cell in found["cells"]]
    lines.append("")
    for side, found in screening["sides"].items():
        lines.append(f"- **{side}** chosen: {setting_text(found['chosen_settings'])} ({found['chosen_score']:.1%}; "
                     f"ties within {screening['tie_points']:g} points go to the larger batch)")
    if screening["trl_precision_timed"] is not None:
        learns = screening["sides"]["trl-lora"]["learns"]
        lines.append(f"- TRL's LoRA side's timed runs: `--trl-precision {screening['trl_precision_timed']}` (its "
                     f"chosen cell is {'' if learns else 'not '}{LEARNS_POINTS:g} points or more above the start "
                     "model's validation exact match)")
    return lines


# ---------------------------------------------------------------------------------------------- running
def validate(args, out: Path, names: list[str]) -> dict:
    """Every checkpoint of the cells `names` and the start model on the validation slice: bench/peer_grpo.py's
    evaluation (one `ppo-rlhf task evaluate --split train` call: the same problems and sampling seed for all)."""
    return evaluate(args, out, names, "validation", "train", DRY_VALIDATION if args.dry_run else VALIDATION,
                    EVAL_REPLIES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/rematch_screen", help="folder for data, runs, checkpoints, results")
    parser.add_argument("--sides", default=",".join(GRID), help=f"comma-separated, from {', '.join(GRID)}")
    parser.add_argument("--trl-precision", default="bf16-weights", choices=["bf16", "fp32", "bf16-weights"],
                        help="TRL's (bench/peer_grpo.py's option): bf16 weights, the plan's for trl-lora")
    parser.add_argument("--omp-wait-policy", default="unset", choices=["unset", "passive"],
                        help="OpenMP's wait policy (bench/peer_grpo.py's option): unset on a quiet machine")
    parser.add_argument("--eval-batch", type=int, default=32, help="replies generated at once in the evaluation")
    parser.add_argument("--report-only", action="store_true",
                        help="write screening.json and print the choice again from OUT's finished cells and evaluation")
    parser.add_argument("--dry-run", action="store_true", help="tiny random models, one step in 2 cells a side, "
                        f"the first {DRY_VALIDATION} validation problems (tests/bench/test_peer_grpo_screen.py)")
    args = parser.parse_args()
    # bench/peer_grpo.py's run_side reads these: the plan's, not options
    args.budget_s, args.checkpoint_every_s, args.seed, args.max_steps = BUDGET_S, CHECKPOINT_EVERY_S, SEED, 0
    if args.dry_run:
        args.max_steps, args.eval_batch, args.trl_precision = 1, 8, "fp32"
    out = Path(args.out)
    sides = args.sides.split(",")
    unknown = [s for s in sides if s not in GRID]
    if unknown:
        parser.error(f"--sides: unknown {', '.join(unknown)}; choose from {', '.join(GRID)}")
    # a dry run steps each side's first and last cell (lowest rate and smaller batch, highest rate and larger batch):
    # both of a side's batch settings and its rate reach the trainer, at a third of the grid's processes
    run_cells = {side: [cells(side)[0], cells(side)[-1]] if args.dry_run else cells(side) for side in sides}
    names = [cell["name"] for side in sides for cell in run_cells[side]]
    if args.report_only:
        missing = [n for n in names if not (out / "eval" / n / "side.json").is_file()]
        if missing or not (out / "validation" / "task_eval.json").is_file():
            parser.error(f"--report-only: {out} has no finished {', '.join(missing) or 'validation evaluation'}")
        results = {n: json.loads((out / "eval" / n / "side.json").read_text()) for n in names}
        finish(out, results, json.loads((out / "validation" / "task_eval.json").read_text()))
        return
    out.mkdir(parents=True, exist_ok=True)
    model, data = start_model(args, out), write_screening_data(out / "data")
    print(f"peer_grpo_screen: {LEVEL}, start model {model}, {len(names)} cells of {BUDGET_S:.0f} s (seed {SEED}"
          f"{', one step each: dry run' if args.dry_run else ''}), trained on {data} (the training problems less "
          f"the first {VALIDATION}), TRL in {args.trl_precision}", flush=True)
    results = {cell["name"]: run_side(side, args, out, model, data, "float32", cell["name"], cell["settings"])
               for side in sides for cell in run_cells[side]}
    finish(out, results, validate(args, out, names))


def finish(out: Path, results: dict[str, dict], evaluation: dict) -> None:
    screening = screening_result(results, evaluation)
    (out / "screening.json").write_text(json.dumps(screening, indent=1) + "\n")
    print("\n".join(["", "For the plan's \"Screening result\" section:", "", *screening["paste"], ""]))
    print(f"wrote {out / 'screening.json'}")


if __name__ == "__main__":
    main()
