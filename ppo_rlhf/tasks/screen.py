"""`compare --horizons ... --screen`: each variant's own settings chosen with the same small budget, on training
instances only, and written down before any held-out run starts.

Budget: SCREEN_CANDIDATES runs per variant and horizon, one seed (the comparison's first), the comparison's
iterations and batch. A critic variant screens its critic's settings, value_lr x {1, 4} and critic_warmup_iterations
{w, w + 2} (w its own: 0, or ppo-warmup's 3); a critic-free variant, which has no critic, screens its policy_lr x
{1, 0.5, 2, 4}. The first candidate is the variant as it stands.

Data: the first VALIDATION problems of the instance's training split (`problems(instance, "train", VALIDATION)`) are
the validation split; the screen's runs train on the other training problems (OUT/screen/hH/train.jsonl) and are
scored on the validation problems (`evaluate_task_runs(split="train")`), their last checkpoint, with the held-out
evaluation's sampling. The held-out problems are never read. Each variant keeps the candidate with the highest
validation success (a tie: the earlier candidate). OUT/screen/chosen.json holds every candidate's settings and
validation success and the choice; the held-out runs take the choice (their config.yaml shows it).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ppo_rlhf.config import build_config
from ppo_rlhf.ppo.train_config import CRITIC_ESTIMATORS, TrainConfig
from ppo_rlhf.study.demo import Stages
from ppo_rlhf.tasks.arithmetic import problems
from ppo_rlhf.tasks.compare import EVAL_BATCH, GROUP_SIZE, VARIANTS, train_in_process
from ppo_rlhf.tasks.comparison import Comparison
from ppo_rlhf.utils.files import atomic_write_text

VALIDATION = 50
"""Training problems held back from the screen's runs to score their candidates."""
SCREEN_CANDIDATES = 4
"""Candidate settings per variant and horizon: the same budget for every variant."""
EVAL_SEED = 1234


def candidates(variant: str, cfg: TrainConfig) -> list[dict[str, Any]]:
    """The settings a variant screens, itself first (`cfg`: its config before the screen)."""
    if VARIANTS[variant]["advantage_estimator"] in CRITIC_ESTIMATORS:
        warmup = cfg.critic_warmup_iterations
        return [{"value_lr": cfg.value_lr * lr, "critic_warmup_iterations": warmup + extra}
                for lr in (1, 4) for extra in (0, 2)]
    return [{"policy_lr": cfg.policy_lr * factor} for factor in (1, 0.5, 2, 4)]


def screen_training_rows(instance: str, train_file: Path) -> str:
    """The training file less the validation problems, as JSONL text."""
    validation = {json.dumps(row["prompt"]) for row in problems(instance, "train", VALIDATION)}
    rows = [json.loads(line) for line in train_file.read_text().splitlines() if line.strip()]
    return "".join(json.dumps(row) + "\n" for row in rows if json.dumps(row["prompt"]) not in validation)


def chosen_settings(scored: dict[str, list[tuple[dict[str, Any], float]]]) -> dict[str, dict[str, Any]]:
    """Per variant, the candidate with the highest validation success; the first of those that tie."""
    return {variant: max(enumerate(found), key=lambda item: (item[1][1], -item[0]))[1][0]
            for variant, found in scored.items()}


def screen_variants(comparison: Comparison, stages: Stages, data_keys: dict[int, str], base_for: Any,
                    overrides: dict[str, Any]) -> dict[int, dict[str, dict[str, Any]]]:
    """Screen every variant at every horizon (each run and each evaluation a stage); write OUT/screen/chosen.json;
    returns {horizon: {variant: chosen settings}}."""
    from ppo_rlhf.tasks.evaluate import evaluate_task_runs  # lazy: torch

    record: dict[str, Any] = {"validation_problems": VALIDATION, "horizons": {}}
    chosen: dict[int, dict[str, dict[str, Any]]] = {}
    for h, instance in comparison.instances.items():
        folder = comparison.out / "screen" / f"h{h}"
        train_file = folder / "train.jsonl"
        def write(_: bool, instance: str = instance, h: int = h, train_file: Path = train_file) -> None:
            rows = screen_training_rows(instance, comparison.out / f"h{h}" / "data" / "train.jsonl")
            atomic_write_text(train_file, rows)

        data_key = stages.run(f"screen data h{h}", {"task": instance, "validation": VALIDATION}, [data_keys[h]],
                              train_file, write)
        runs: dict[str, list[tuple[dict[str, Any], TrainConfig]]] = {}
        keys = []
        for variant in comparison.variants:
            first = comparison.configs[h][variant, 0]
            runs[variant] = []
            for j, settings in enumerate(candidates(variant, first)):
                cfg = build_config(TrainConfig, base_for(instance), overrides, VARIANTS[variant], settings,
                                   {"group_size": GROUP_SIZE, "seed": first.seed, "prompts": str(train_file),
                                    "out": str(folder / "runs" / f"{variant}_c{j}")})
                runs[variant].append((settings, cfg))
                final = Path(cfg.out) / "checkpoints" / f"iter_{cfg.iterations:06d}"

                def train(continuing: bool, cfg: TrainConfig = cfg, config_file: Path = folder / "configs" /
                          f"{variant}_c{j}.yaml") -> None:
                    train_in_process(cfg, config_file, continuing)

                settings_key = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("out", "device")}
                keys.append(stages.run(f"screen h{h} {variant}_c{j}", settings_key, [data_key], final, train))
        eval_file = folder / "validation.json"
        configs = [cfg for found in runs.values() for _, cfg in found]

        def evaluate(_: bool, configs: list[TrainConfig] = configs, instance: str = instance,
                     eval_file: Path = eval_file) -> None:
            result = evaluate_task_runs([cfg.out for cfg in configs], instance, VALIDATION, 1,
                                        str(configs[0].iterations), EVAL_SEED, EVAL_BATCH, configs[0].device,
                                        split="train")
            atomic_write_text(eval_file, json.dumps(result, indent=1, ensure_ascii=False) + "\n")

        stages.run(f"screen validation h{h}", {"validation": VALIDATION, "seed": EVAL_SEED}, keys, eval_file,
                   evaluate)
        success = {s["run"]: s["accuracy"]["mean"] for s in json.loads(eval_file.read_text())["summary"]
                   if s["run"] is not None}
        scored = {variant: [(settings, success[Path(cfg.out).name]) for settings, cfg in found]
                  for variant, found in runs.items()}
        chosen[h] = chosen_settings(scored)
        record["horizons"][str(h)] = {variant: {"chosen": chosen[h][variant], "candidates": [
            {"settings": settings, "validation_success": value} for settings, value in found]}
            for variant, found in scored.items()}
    atomic_write_text(comparison.out / "screen" / "chosen.json", json.dumps(record, indent=1) + "\n")
    return chosen
