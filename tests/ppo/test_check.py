"""`ppo-rlhf check`: every invariant passes on the correct code and fails on a set-up broken on purpose."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from ppo_rlhf.cli import main
from ppo_rlhf.config import build_config
from ppo_rlhf.ppo.check import check_config, run_checks
from ppo_rlhf.ppo.train_config import TrainConfig

import tiny

PROMPTS = ["Tell me a story", "Hello! How are you?", "What is the source of energy?", "Once upon a time"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("check")
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, root / "policy")
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, root / "reward")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    # 48 tokens: with this seed some replies of the random tiny policy emit EOS (the masks check needs one);
    # float32: the invariants hold to their fp32 tolerances (bf16's looser ones are exercised by the bf16 test below)
    values = dict(policy_model=str(policy), reward_model=str(reward), prompts=str(prompts), out=str(root / "run"),
                  max_new_tokens=48, lora_rank=4, batch_size=8, minibatch_size=4, dtype="float32")
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(values))
    return {"values": values, "config": str(config), "root": root}


def statuses(setup, **overrides) -> dict[str, str]:
    results = run_checks(build_config(TrainConfig, setup["values"], overrides))
    return {result.name: result.status for result in results}


def test_every_invariant_holds_on_the_correct_code(setup, capsys):
    assert main(["check", "--config", setup["config"]]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = ("first-ratio", "reference", "masks", "score-position", "micro-batches", "cap")
    assert [line.split()[:2] for line in lines[:-1]] == [["pass", name] for name in names]
    assert lines[-1] == "6/6 invariants hold"


def test_first_ratio_fails_with_a_wrong_temperature_in_training(setup, monkeypatch):
    import ppo_rlhf.ppo.roles as roles

    correct = roles.token_logprobs

    def temperature_1_with_gradients(model, ids, att, temperature, **kwargs):  # the bug: logits not divided by T
        return correct(model, ids, att, 1.0 if torch.is_grad_enabled() else temperature, **kwargs)

    monkeypatch.setattr(roles, "token_logprobs", temperature_1_with_gradients)
    assert statuses(setup)["first-ratio"] == "FAIL"


def test_reference_fails_when_the_adapter_stays_on(setup, monkeypatch):
    from ppo_rlhf.ppo.roles import Actor

    monkeypatch.setattr(Actor, "reference_logprobs", lambda self, ids, att, first: self.logprobs(ids, att, first))
    found = statuses(setup)
    # at the start the adapter is zero, so the first KL is 0 all the same: only moving the adapter shows the bug
    assert found["reference"] == "FAIL" and found["first-ratio"] == "pass"


def test_masks_fail_when_eos_is_dropped(setup, monkeypatch):
    from ppo_rlhf.ppo.trainer import PPOLoop

    correct = PPOLoop.rollout

    def drops_eos(self, prompts):  # the bug: a mask built from token != pad, which for pad == eos drops the EOS
        rollout = correct(self, prompts)
        for row in range(len(rollout.prompts)):
            if rollout.finished[row]:
                rollout.action_mask[row, len(rollout.prompt_ids[row]) + len(rollout.reply_ids[row]) - 2] = 0
        return rollout

    monkeypatch.setattr(PPOLoop, "rollout", drops_eos)
    assert statuses(setup)["masks"] == "FAIL"


def test_score_position_fails_with_the_score_on_the_first_reply_token(setup, monkeypatch):
    from dataclasses import replace

    import ppo_rlhf.ppo.trainer as trainer
    from ppo_rlhf.ppo.objectives import shape_rewards

    def score_on_first(scores, kl, mask, beta, env_rewards=None):
        shaped = shape_rewards(scores, kl, mask, beta, env_rewards)
        rewards = shaped.per_token + 0.0
        rows = torch.arange(len(scores))
        last = mask.shape[1] - 1 - mask.flip(1).argmax(1)
        rewards[rows, last] -= scores
        rewards[rows, mask.argmax(1)] += scores
        return replace(shaped, per_token=rewards)

    monkeypatch.setattr(trainer, "shape_rewards", score_on_first)
    assert statuses(setup)["score-position"] == "FAIL"


def test_micro_batches_fail_when_each_averages_over_its_own_tokens(setup, monkeypatch):
    import ppo_rlhf.ppo.objectives as objectives

    correct = objectives.normalise_loss
    monkeypatch.setattr(objectives, "normalise_loss",  # the bug: the micro-batch's own count, not the minibatch's
                        lambda per_token, mask, aggregation="token", count=None: correct(per_token, mask, aggregation))
    assert statuses(setup)["micro-batches"] == "FAIL"


def test_cap_fails_when_no_reply_can_finish(setup, capsys):
    found = statuses(setup, max_new_tokens=1)
    assert found["cap"] == "FAIL"
    config = setup["root"] / "short.yaml"
    config.write_text(yaml.safe_dump({**setup["values"], "max_new_tokens": 1}))
    assert main(["check", "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  cap" in out and "never finished: 'Tell me a story'" in out and "failed: cap" in out
    assert "(only 0% of 8 start-policy replies finished within max_new_tokens=1: with eos_rule on, every unfinished " \
           "reply scores unfinished_score=-1 instead of its reward" in out  # the sentence `train` says at its start


def test_bad_input_is_exit_2(setup, tmp_path, capsys):
    assert main(["check", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_bf16_set_up_reports_its_dtype_and_tolerances(setup, capsys):
    """dtype bfloat16: first ratio and KL still exact (log pi_old is recomputed by the same forward), the report names
    the dtype and its tolerance."""
    config = setup["root"] / "bf16.yaml"
    config.write_text(yaml.safe_dump({**setup["values"], "dtype": "bfloat16"}))
    main(["check", "--config", str(config)])
    out = capsys.readouterr().out
    assert "pass  first-ratio" in out and "tolerance 0.05, bfloat16" in out


ENVIRONMENT = '''
class Echo:
    """Two turns: the reply's length comes back, with a reward of 0.5 for each turn."""

    def reset(self, prompt, **row):
        return None

    def step(self, text):
        return f"{len(text)} characters.", 0.5, False
'''


@pytest.fixture(scope="module")
def multi_turn(setup):
    environment = setup["root"] / "echo_env.py"
    environment.write_text(ENVIRONMENT)
    return {**setup, "values": {**setup["values"], "environment": f"{environment}:Echo", "max_turns": 2,
                                "max_new_tokens": 24, "max_episode_tokens": 120}}


def test_every_invariant_holds_on_multi_turn_episodes(multi_turn):
    from ppo_rlhf.ppo.check import INVARIANTS
    from ppo_rlhf.ppo.trainer import PPOLoop

    trainer = PPOLoop(check_config(build_config(TrainConfig, multi_turn["values"]), 8))
    experience = trainer.score(trainer.rollout(trainer.next_prompts()))
    assert any(e.turns == 2 for e in experience.episodes)  # observations between the turns to check
    results = {invariant.__name__: invariant(trainer, experience) for invariant in INVARIANTS}
    assert all(r.status == "pass" for name, r in results.items() if name != "cap"), results
    assert "padding/prompt/observation positions trained" in results["masks"].detail


def test_masks_fail_when_observations_are_trained_and_score_position_when_turn_rewards_vanish(multi_turn,
                                                                                             monkeypatch):
    import ppo_rlhf.multiturn.episodes as episodes

    correct = episodes._layout

    def observations_trained(*layout):  # the bug: every token after the prompt is an action
        rollout, found = correct(*layout)
        for row, episode in enumerate(found):
            start = len(episode.prompt_ids) - 1
            rollout.action_mask[row, start : start + len(episode.tokens)] = 1
        return rollout, found

    monkeypatch.setattr(episodes, "_layout", observations_trained)
    assert statuses(multi_turn)["masks"] == "FAIL"
    monkeypatch.setattr(episodes, "_layout", correct)

    def turn_rewards_lost(*layout):  # the bug: only the final score reaches the rewards
        rollout, found = correct(*layout)
        rollout.env_rewards.zero_()
        return rollout, found

    monkeypatch.setattr(episodes, "_layout", turn_rewards_lost)
    assert statuses(multi_turn)["score-position"] == "FAIL"
