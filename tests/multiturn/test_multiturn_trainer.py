"""Multi-turn runs through the public API on tiny models: an environment whose rewards and observations reach the
batch, the dashboard's episode numbers, GAE (token- and turn-level) and RLOO over whole trajectories, resume to an
identical history (the environment's Python RNG included), and user code that fails stopping the run in one line
with its checkpoint intact."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from ppo_rlhf import PPOConfig, PPOTrainer, UsageError

import tiny

PROMPTS = [{"prompt": p, "target": i % 3} for i, p in enumerate(["Tell me a story", "Hello! How are you?",
                                                                  "Once upon a time", "The quick brown fox"])]


@pytest.fixture(scope="module")
def policy(tmp_path_factory, tokenizer):
    return str(tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, tmp_path_factory.mktemp("mt") / "policy"))


class Counter:
    """Three turns at most; a reward of 0.1 per reply character that is a digit, and a random nudge from Python's
    RNG (so a resumed run only matches when that RNG's state is restored)."""

    def reset(self, prompt, target, **row):
        self.target = target
        return f"Say {target}."

    def step(self, text):
        digits = sum(c.isdigit() for c in text)
        return f"You said {len(text)} characters.", 0.1 * digits + random.random() * 0.01, False


def settings(policy, out: Path, **overrides) -> PPOConfig:
    values = dict(policy_model=policy, out=str(out), iterations=3, batch_size=4, minibatch_size=2, epochs=1,
                  max_new_tokens=5, max_turns=3, max_episode_tokens=200, reward_norm_samples=4, lora_rank=4,
                  checkpoint_every=1, report_to=[], quiet=True, policy_lr=1e-3, value_lr=1e-3, dtype="float32")
    return PPOConfig(**(values | overrides))


def reply_length(completions, **columns):
    return [float(len(c)) for c in completions]


def history(trainer) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(("time_", "gen_tokens"))} for row in trainer.history]


@pytest.mark.parametrize("overrides", [{}, {"turn_level_gae": True},
                                       {"advantage_estimator": "rloo", "group_size": 2},
                                       {"advantage_estimator": "grpo", "group_size": 2},
                                       {"reward_model": "REWARD"}, {"value_model": "REWARD"}],
                         ids=["gae", "turn-gae", "rloo", "grpo", "critic-from-reward-model", "value-model"])
def test_an_environment_run_records_its_episodes(policy, tiny_model_dirs, tmp_path, overrides):
    """Every estimator and every critic: a cold one, one initialised from the reward model (whose adapter off scores
    the last turn), a separate value_model."""
    overrides = {k: str(tiny_model_dirs["reward"]) if v == "REWARD" else v for k, v in overrides.items()}
    trainer = PPOTrainer(settings(policy, tmp_path / "run", **overrides), reward_funcs=[reply_length],
                         train_dataset=PROMPTS, environment_factory=Counter)
    trainer.train()
    rows = trainer.history
    assert len(rows) == 3 and all(row["turns"] == 3 for row in rows)  # the environment never says done
    assert all(0 < row["masked_share"] < 1 and row["tool_calls"] == 0 for row in rows)
    assert all(torch.isfinite(torch.tensor(row["pg_loss"])) for row in rows)
    assert trainer.config.environment.endswith("Counter")


def test_a_stopped_multi_turn_run_resumes_to_the_same_history(policy, tmp_path):
    whole = PPOTrainer(settings(policy, tmp_path / "a", checkpoint_every=10), reward_funcs=[reply_length],
                       train_dataset=PROMPTS, environment_factory=Counter)
    whole.train()
    first = PPOTrainer(settings(policy, tmp_path / "b", iterations=2, checkpoint_every=10),
                       reward_funcs=[reply_length], train_dataset=PROMPTS, environment_factory=Counter)
    first.train()
    resumed = PPOTrainer(settings(policy, tmp_path / "b", checkpoint_every=10), reward_funcs=[reply_length],
                         train_dataset=PROMPTS, environment_factory=Counter, resume=True)
    resumed.train()
    assert history(resumed) == history(whole)


class Breaks(Counter):
    calls = 0

    def step(self, text):
        Breaks.calls += 1
        if Breaks.calls > 4 * 3 + 4 * 3:  # the reward normalisation's batch and the first iteration's pass
            raise ValueError("broken board")
        return super().step(text)


def test_an_environment_that_raises_stops_the_run_in_one_line_with_its_checkpoint(policy, tmp_path):
    trainer = PPOTrainer(settings(policy, tmp_path / "run"), reward_funcs=[reply_length], train_dataset=PROMPTS,
                         environment_factory=Breaks)
    # the environment named as config.yaml records it (the API's object: module:name); then what was kept and how to
    # continue, in the API's words
    with pytest.raises(UsageError, match=r"environment step \(turn 1\) of \S+:Breaks raised ValueError: broken board"
                                         r"; the latest checkpoint is iter_000001; once it is fixed, continue with: "
                                         r"PPOTrainer\(config, \.\.\., resume=True\)\.train\(\) with the same rewards "
                                         r"and dataset$"):
        trainer.train()
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "iter_000001"


class BreaksAtOnce(Counter):
    def step(self, text):
        raise ValueError("broken board")


def test_an_environment_that_raises_before_the_first_iteration_says_nothing_was_kept(policy, tmp_path):
    trainer = PPOTrainer(settings(policy, tmp_path / "run"), reward_funcs=[reply_length], train_dataset=PROMPTS,
                         environment_factory=BreaksAtOnce)
    with pytest.raises(UsageError, match=r"raised ValueError: broken board; nothing was written yet: once it is "
                                         r"fixed, run the same code again$"):
        trainer.train()
    assert not (tmp_path / "run").exists()


def test_multi_turn_refusals(policy, tmp_path, monkeypatch):
    from ppo_rlhf.parallel.distributed import Dist

    monkeypatch.setattr("ppo_rlhf.ppo.trainer.current", lambda: Dist(0, 2, fsdp=True))
    with pytest.raises(UsageError, match="not supported under FSDP"):
        PPOTrainer(settings(policy, tmp_path / "x"), reward_funcs=[reply_length], train_dataset=PROMPTS,
                   environment_factory=Counter)
    monkeypatch.undo()
    with pytest.raises(UsageError, match="generation_backend: hf"):
        settings(policy, tmp_path / "x", generation_backend="vllm", tools=["m.py:f"])
    with pytest.raises(UsageError, match="turn_level_gae is GAE"):
        settings(policy, tmp_path / "x", turn_level_gae=True, advantage_estimator="grpo", group_size=2, tools=["m:f"])


def test_reward_functions_and_judges_see_the_rows_columns_after_an_observation(policy, tmp_path):
    """Counter's reset appends "Say {target}." to the prompt: each row's `target` still reaches the reward function
    (a required argument), the monitor judge and the rollout, matched to its own episode."""
    seen: list[tuple[list, list]] = []

    def says_target(prompts, completions, target, **kw):
        seen.append((prompts, target))
        return [float(str(t) in c) for c, t in zip(completions, target)]

    def judge_target(prompts, completions, target, **kw):
        return [float(t) for t in target]

    trainer = PPOTrainer(settings(policy, tmp_path / "run", iterations=1), reward_funcs=[says_target],
                         train_dataset=PROMPTS, environment_factory=Counter, monitor_judges=[judge_target])
    trainer.train()
    assert len(seen) == 2  # the normalisation's batch and the iteration's
    for prompts, targets in seen:
        assert all(prompt[-1]["content"].endswith(f"Say {t}.") for prompt, t in zip(prompts, targets))
    experience = trainer.loop.score(trainer.loop.rollout(trainer.loop.next_prompts()))
    assert [row["target"] for row in experience.columns] == [int(p[-1]["content"][-2]) for p in experience.prompts]


def test_an_environment_alone_gives_the_rewards(policy, tmp_path):
    """No reward function: every score is 0 (its normalisation divides by nothing), the environment's rewards are the
    training signal and reach the advantages. (eos_rule off: it would give unfinished turns -1, as with any reward.)"""
    trainer = PPOTrainer(settings(policy, tmp_path / "run", iterations=2, eos_rule=False), train_dataset=PROMPTS,
                         environment_factory=Counter)
    trainer.train()
    assert all(row["score"] == 0 and math.isfinite(row["pg_loss"]) for row in trainer.history)
    # the history shows what the environment paid, which `score` (the reward functions' share) does not
    assert all(row["env_reward"] > 0 for row in trainer.history)
    loop = trainer.loop
    assert (loop.reward_mean, loop.reward_std) == (0.0, 1.0)
    experience = loop.score(loop.rollout(loop.next_prompts()))
    act = experience.action_mask
    # the per-token rewards are -beta * KL plus each turn's environment reward at its last token, and nothing else
    env = experience.rewards + loop.reward_beta * experience.kl * act
    assert float(env.abs().sum()) > 0
    torch.testing.assert_close(env, experience.env_rewards * act)
    # GRPO (KL in the loss): the environment's rewards are all an advantage can come from
    grpo = PPOTrainer(settings(policy, tmp_path / "grpo", iterations=1, advantage_estimator="grpo", group_size=2,
                               eos_rule=False), train_dataset=PROMPTS, environment_factory=Counter)
    grpo.train()
    experience = grpo.loop.score(grpo.loop.rollout(grpo.loop.next_prompts()))
    assert bool((experience.scores == 0).all()) and float(experience.advantages.abs().sum()) > 0


def test_tools_alone_still_need_a_reward(policy, tmp_path):
    with pytest.raises(UsageError, match="reward_model or reward_funcs is required"):
        PPOTrainer(settings(policy, tmp_path / "run", tools=["m.py:f"]), train_dataset=PROMPTS)


def test_completion_ids_are_the_last_turns_and_the_trajectory_is_named_apart(policy, tokenizer, tmp_path):
    seen: list[tuple[list, list, list]] = []

    def token_count(completions, completion_ids, trajectory_ids, **kw):
        seen.append((completions, completion_ids, trajectory_ids))
        return [float(len(ids)) for ids in completion_ids]

    trainer = PPOTrainer(settings(policy, tmp_path / "run", iterations=1), reward_funcs=[token_count],
                         train_dataset=PROMPTS, environment_factory=Counter)
    trainer.train()
    for completions, completion_ids, trajectory_ids in seen:
        for text, ids, trajectory in zip(completions, completion_ids, trajectory_ids):
            assert tokenizer.decode(ids, skip_special_tokens=True) == text[-1]["content"]  # as `completions`
            assert trajectory[-len(ids):] == ids and len(trajectory) > len(ids)  # every turn, the observations
            assert "You said" in tokenizer.decode(trajectory)


def test_multi_turn_is_a_rollout_generator(policy, tmp_path):
    """Episodes are sampled by a generator with the single-turn backends' interface, not by a branch of the loop:
    the rollout carries each row's episode and dataset columns, and the loop's source never asks whether the run
    is multi-turn."""
    import ppo_rlhf.ppo.trainer as trainer_module
    from ppo_rlhf.multiturn.generator import EpisodeGenerator

    loop = PPOTrainer(settings(policy, tmp_path / "x"), reward_funcs=[reply_length], train_dataset=PROMPTS,
                      environment_factory=Counter).loop
    assert isinstance(loop.generator, EpisodeGenerator)
    rows = loop.batch_prompts([0, 1])
    rollout = loop.generator.generate([row.prompt for row in rows], [row.columns for row in rows])
    assert rollout.columns == [{"target": 0}, {"target": 1}]
    assert rollout.episodes is not None and len(rollout.episodes) == 2
    assert [e.prompt_ids for e in rollout.episodes] == rollout.prompt_ids  # each row's own episode
    assert rollout.select([1]).episodes == [rollout.episodes[1]]  # rows keep their episodes when selected
    assert "multi_turn" not in Path(trainer_module.__file__).read_text()
