"""The proxy ensemble: its combination rules by hand, and the reward function and judge scoring what they claim."""

import json
import math

import numpy as np
import pytest

from ppo_rlhf.errors import UsageError
from ppo_rlhf.rewards import resolve_reward_funcs
from ppo_rlhf.study.ensemble import (
    ENSEMBLE_FILE,
    combine,
    member_norms,
    reward_spec,
    standardised,
    write_ensemble,
)
from ppo_rlhf.study.judges import make_judge

import tiny

# three members' standardised scores of two replies
SCORES = np.array([[1.0, -2.0],
                   [3.0, 0.0],
                   [2.0, 5.0]])


def test_the_combination_rules_by_hand():
    assert combine(SCORES, "min").tolist() == [1.0, -2.0]
    # reply 0: mean 2, population variance ((1-2)^2 + (3-2)^2 + 0) / 3 = 2/3; reply 1: mean 1, ((-3)^2 + 1 + 4^2) / 3
    var0, var1 = 2 / 3, 26 / 3
    assert combine(SCORES, "mean-std", 0.5) == pytest.approx([2 - 0.5 * math.sqrt(var0), 1 - 0.5 * math.sqrt(var1)])
    assert combine(SCORES, "mean-var", 0.5) == pytest.approx([2 - 0.5 * var0, 1 - 0.5 * var1])
    assert combine(SCORES, "mean-std", 0.0) == pytest.approx([2.0, 1.0])  # lambda 0: the mean
    with pytest.raises(UsageError, match="ensemble rule must be one of min, mean-std, mean-var, got 'max'"):
        combine(SCORES, "max")
    with pytest.raises(UsageError, match="ensemble lambda must be >= 0"):
        combine(SCORES, "mean-std", -1.0)


def test_members_are_standardised_before_they_are_combined():
    raw = np.array([[10.0, 14.0], [0.0, -1.0]])
    norms = [{"mean": 12.0, "std": 2.0}, {"mean": 0.0, "std": 0.0}]  # a zero std leaves the scale at 1
    assert standardised(raw, norms).tolist() == [[-1.0, 1.0], [0.0, -1.0]]


@pytest.fixture(scope="module")
def members(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("members")
    return [tiny.save_tiny(tiny.tiny_reward_model(tokenizer, seed=k), tokenizer, root / f"rm{k}") for k in range(3)]


PROMPTS = ["Tell me a story.", "What is energy?", "Hello!", "Once upon a time"]
REPLIES = ["The quick brown fox.", "I love this happy day.", "This is terrible.", "There was a king."]


@pytest.mark.parametrize("rule", ["min", "mean-std"])
def test_the_ensemble_reward_and_judge_score_the_rule_of_their_members(tmp_path, members, rule):
    load = {"dtype": "float32", "device": "cpu", "batch_size": 2}
    norms = member_norms(members, PROMPTS, REPLIES, load)
    folder = write_ensemble(tmp_path / "ensemble", members, norms, rule, 1.5, load)
    # by hand: each member on its own (the evaluation's reward-model judge), standardised, combined
    raw = np.array([make_judge(f"rm:{m}").score(PROMPTS, REPLIES) for m in members])
    assert [n["mean"] for n in norms] == pytest.approx(raw.mean(axis=1), abs=1e-5)
    assert [n["std"] for n in norms] == pytest.approx(raw.std(axis=1), abs=1e-5)
    z = (raw - raw.mean(axis=1, keepdims=True)) / raw.std(axis=1, keepdims=True)
    expected = z.min(axis=0) if rule == "min" else z.mean(axis=0) - 1.5 * z.std(axis=0)
    # the reward function a PPO run names (the folder's reward.py, imported as a user's file is)
    [reward] = resolve_reward_funcs([reward_spec(folder)])
    assert reward.name == "ensemble_reward"
    scores = reward(prompts=PROMPTS, completions=REPLIES, completion_ids=[[1]] * 4)
    assert scores == pytest.approx(expected.tolist(), abs=1e-4)
    # the judge the evaluation scores the ensemble's runs with
    assert make_judge(f"ensemble:{folder}").score(PROMPTS, REPLIES) == pytest.approx(expected.tolist(), abs=1e-4)
    spec = json.loads((folder / ENSEMBLE_FILE).read_text())
    assert spec["rule"] == rule and spec["members"] == [str(m.resolve()) for m in members]


def test_an_ensemble_judge_needs_its_folder(tmp_path):
    with pytest.raises(UsageError, match=f"judge ensemble:{tmp_path}: no ensemble.json in"):
        make_judge(f"ensemble:{tmp_path}")
