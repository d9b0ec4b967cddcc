"""`compare --horizons --screen`'s pure parts: the same budget for every variant, a validation split taken from the
training problems only, and the choice."""

from __future__ import annotations

import json

from ppo_rlhf.config import build_config
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.tasks.arithmetic import problems, write_task
from ppo_rlhf.tasks.compare import VARIANTS
from ppo_rlhf.tasks.screen import SCREEN_CANDIDATES, VALIDATION, candidates, chosen_settings, screen_training_rows


def test_every_variant_screens_as_many_candidates_itself_first():
    for variant, settings in VARIANTS.items():
        cfg = build_config(TrainConfig, {"reward_funcs": ["x.py:f"], "prompts": "p.jsonl", "group_size": 2},
                           settings)
        found = candidates(variant, cfg)
        assert len(found) == SCREEN_CANDIDATES and len({json.dumps(c, sort_keys=True) for c in found}) == len(found)
        assert all(getattr(cfg, key) == value for key, value in found[0].items()), variant
    ppo = build_config(TrainConfig, {"value_lr": 1e-4}, VARIANTS["ppo-warmup"])
    assert candidates("ppo-warmup", ppo) == [{"value_lr": 1e-4, "critic_warmup_iterations": 3},
                                             {"value_lr": 1e-4, "critic_warmup_iterations": 5},
                                             {"value_lr": 4e-4, "critic_warmup_iterations": 3},
                                             {"value_lr": 4e-4, "critic_warmup_iterations": 5}]
    assert [c["policy_lr"] for c in candidates("grpo", build_config(TrainConfig, {"policy_lr": 2e-5, "group_size": 2},
                                                                    VARIANTS["grpo"]))] == [2e-5, 1e-5, 4e-5, 8e-5]


def test_the_validation_split_is_training_problems_the_screen_does_not_train_on(tmp_path):
    train_file, heldout_file = write_task("add-tiny", tmp_path, seed=0)
    screen_rows = [json.loads(line) for line in screen_training_rows("add-tiny", train_file).splitlines()]
    validation = [row["prompt"] for row in problems("add-tiny", "train", VALIDATION)]
    train = [json.loads(line)["prompt"] for line in train_file.read_text().splitlines()]
    heldout = {json.loads(line)["prompt"] for line in heldout_file.read_text().splitlines()}
    screened = {row["prompt"] for row in screen_rows}
    assert set(validation) <= set(train) and not set(validation) & screened and not heldout & set(validation)
    assert len(screened) == len(train) - VALIDATION


def test_the_choice_is_the_best_validation_success_the_first_of_a_tie():
    scored = {"ppo": [({"value_lr": 1}, 0.4), ({"value_lr": 4}, 0.6), ({"value_lr": 8}, 0.6)],
              "rloo": [({"policy_lr": 1}, 0.5), ({"policy_lr": 2}, 0.5)]}
    assert chosen_settings(scored) == {"ppo": {"value_lr": 4}, "rloo": {"policy_lr": 1}}
