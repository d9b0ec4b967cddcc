"""The environment tasks with a horizon knob (key-door-H, guess-H): each environment's reset and step, the exact
checks, seeded identical replays (a resumed training run's secrets included), disjoint splits, the `task` command's
list and files, and their held-out evaluation in episodes."""

from __future__ import annotations

import random

import pytest

from ppo_rlhf import PPOConfig, PPOTrainer, UsageError
from ppo_rlhf.cli import main
from ppo_rlhf.data import load_prompt_rows
from ppo_rlhf.study.evaluate import START
from ppo_rlhf.tasks import guess_number, horizon, key_door
from ppo_rlhf.tasks.arithmetic import check_task, problems, task_environment
from ppo_rlhf.tasks.evaluate import summarize_task

import tiny


def play(env, row: dict, replies: list[str]) -> list[tuple[str, float | None, bool]]:
    """Reset `env` with the row and step it with the replies until it is done."""
    env.reset(**row)
    steps = []
    for reply in replies:
        steps.append(env.step(reply))
        if steps[-1][2]:
            break
    return steps


def key_door_row(horizon_turns: int) -> dict:
    return problems(f"key-door-{horizon_turns}", "train", 1)[0]


def walk(row: dict, key: str) -> list[str]:
    """Replies that take `key`, take the first offered way at every corridor step and open the door."""
    ways = key_door.corridor(row["keys"], row["right"], row["horizon"])
    return [f"I take the {key} key.", *[first for first, _ in ways], "open"]


@pytest.mark.parametrize("turns", [2, 4, 8, 16])
def test_key_door_pays_only_at_the_door_and_only_for_the_right_key(turns):
    row = key_door_row(turns)
    wrong = next(key for key in row["keys"] if key != row["right"])
    right_steps = play(key_door.KeyDoor(), row, walk(row, row["right"]))
    assert len(right_steps) == turns  # the horizon is the number of turns
    assert [reward for _, reward, _ in right_steps[:-1]] == [None] * (turns - 1)  # nothing before the door
    assert right_steps[-1] == ("The door opens.", 1.0, True)
    assert [done for _, _, done in right_steps[:-1]] == [False] * (turns - 1)
    env = key_door.KeyDoor()
    wrong_steps = play(env, row, walk(row, wrong))
    assert len(wrong_steps) == turns and wrong_steps[-1] == ("The key does not fit.", 0.0, True)
    assert (env.success, env.moves, env.valid_moves) == (False, turns, turns)
    if turns > 2:  # the corridor's questions offer the instance's ways and never mention the right key
        assert "Ways:" in right_steps[0][0] and all(row["right"] not in text for text, _, _ in right_steps[1:-1])


def test_key_door_ends_on_an_invalid_move_with_nothing():
    row = key_door_row(4)
    offered, then = key_door.corridor(row["keys"], row["right"], 4)
    unoffered = next(way for way in key_door.WAYS if way not in offered)
    for replies in (["I take a key."], [f"{row['keys'][0]} or {row['keys'][1]}"],
                    [row["right"], unoffered], [row["right"], f"{offered[0]} and {offered[1]}"],
                    [row["right"], offered[0], then[0], "close it"]):
        env = key_door.KeyDoor()
        steps = play(env, row, replies)
        assert steps[-1] == (key_door.INVALID, 0.0, True) and len(steps) == len(replies)
        assert (env.moves, env.valid_moves, env.success) == (len(replies), len(replies) - 1, False)
    assert key_door.named("goldkey, GOLD", ["gold", "red"]) == ["gold"] and key_door.named("covered", ["red"]) == []
    assert key_door.opens("red", "red") and not key_door.opens("blue", "red")


def test_key_door_splits_never_share_an_instance_at_any_horizon():
    instance = lambda rows: {(tuple(r["keys"]), r["right"]) for r in rows}  # noqa: E731
    train, heldout = problems("key-door-4", "train"), problems("key-door-4", "heldout")
    assert not instance(train) & instance(heldout)
    assert len(instance(train)) + len(instance(heldout)) == len(key_door.INSTANCES) == 2160
    assert instance(problems("key-door-16", "heldout")) == instance(heldout)  # the split is the instance's, not H's
    assert problems("key-door-4", "train", 5) == train[:5] and problems("key-door-4", "train", 5, seed=1) != train[:5]
    row = train[0]
    assert row["prompt"][:-1] == key_door.DEMONSTRATION and row["right"] in row["keys"]
    assert f"opens only with the {row['right']} key" in row["prompt"][-1]["content"]
    assert key_door.corridor(row["keys"], row["right"], 6) == key_door.corridor(row["keys"], row["right"], 6)


def binary_search(env: guess_number.GuessNumber, row: dict) -> list[tuple[int, str, float | None, bool]]:
    """Play the game by halving the range left; the guesses and the environment's answers."""
    env.reset(**row)
    low, high, played = row["low"], row["high"], []
    while True:
        guess = (low + high) // 2
        observation, reward, done = env.step(f"{guess}")
        played.append((guess, observation, reward, done))
        if done:
            return played
        low, high = (guess + 1, high) if observation.startswith("Higher") else (low, guess - 1)


def test_guess_feedback_the_exact_check_and_the_end_of_the_tries():
    row = problems("guess-4", "train", 1)[0]
    assert (row["low"], row["high"], row["tries"]) == (1, 16, 4) and row["prompt"][:-1] == guess_number.DEMONSTRATION
    env = guess_number.GuessNumber()
    random.seed(3)
    played = binary_search(env, row)
    while len(played) < 3:  # a game with feedback to check (the first secrets may be found at once)
        played = binary_search(env, row)
    assert env.secret in range(1, 17) and played[-1][1:] in (("Correct!", 1.0, True),
                                                             (f"No tries left. It was {env.secret}.", 0.0, True))
    assert all(reward is None and not done for _, _, reward, done in played[:-1])  # reward only at the end
    assert all(("Higher." if g < env.secret else "Lower.") in text for g, text, _, _ in played[:-1])
    assert played[0][1].endswith("3 tries left.") and env.success == (played[-1][0] == env.secret)
    env.reset(**row)
    env.secret = 9
    assert [env.step(r)[:2] for r in ("I say 2", "20", "8")] == [("Higher. 3 tries left.", None),
                                                                  ("Lower. 2 tries left.", None),
                                                                  ("Higher. 1 try left.", None)]
    assert env.step("1,0") == ("No tries left. It was 9.", 0.0, True) and (env.moves, env.valid_moves) == (4, 4)
    env.reset(**row)
    assert env.step("no idea") == (guess_number.INVALID, 0.0, True) and (env.moves, env.valid_moves) == (1, 0)
    assert guess_number.guessed("maybe 12 or 13") == 12 and guess_number.is_secret(5, 5)


def test_guess_draws_a_secret_per_episode_and_replays_them_from_the_seed():
    row = problems("guess-8", "train", 1)[0]

    def games(seed: int) -> list:
        random.seed(seed)
        return [binary_search(guess_number.GuessNumber(), row) for _ in range(20)]

    first = games(7)
    assert games(7) == first and games(8) != first  # the same seed replays every episode exactly
    secrets = {g[-1][0] for g in first if g[-1][2] == 1.0}
    assert len(secrets) > 5  # one prompt, easy and hard episodes
    assert {len(g) for g in first} != {1} and all(g[-1][2] == 1.0 for g in first)  # 8 tries always find 1..32


def test_every_guess_row_is_the_one_game_of_its_horizon():
    assert problems("guess-16", "heldout") == [problems("guess-16", "train", 1)[0]] * guess_number.POOL["heldout"]
    assert "from 1 to 64" in problems("guess-16", "train", 1)[0]["prompt"][-1]["content"]


def test_task_names_carry_the_horizon():
    assert horizon.parse("key-door-8") == (key_door, 8) and horizon.parse("guess-16") == (guess_number, 16)
    assert check_task("key-door-6") == "key-door-6" and task_environment("guess-3") is guess_number.environment
    assert task_environment("calc-steps") is None and task_environment("add-tiny") is None
    for bad in ("key-door-1", "key-door-17", "key-door", "guess-x", "door-8"):
        assert horizon.parse(bad) is None
        with pytest.raises(UsageError, match=r"key-door-H \(H 2-16\), guess-H \(H 2-16\)"):
            check_task(bad)
    assert horizon.environment_reward_only([[], []], ["a", "b"], [[], []], keys=[1, 2]) == [0.0, 0.0]


def test_the_task_command_lists_and_writes_the_horizon_tasks(tmp_path, capsys):
    assert main(["task", "list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    door, guess = listed[-2:]
    assert door.startswith("key-door-H ") and "key-door-2, key-door-4, key-door-8, key-door-16" in door
    assert "1,526 train, 634 held-out instances" in door and "(any H from 2 to 16)" in door
    assert guess.startswith("guess-H ") and "guess-2, guess-4, guess-8, guess-16" in guess
    assert main(["task", "write", "key-door-8", "--out", str(tmp_path / "kd"), "--train", "40"]) == 0
    train, heldout = (load_prompt_rows(str(tmp_path / "kd" / f"{split}.jsonl")) for split in ("train", "heldout"))
    assert len(train) == 40 and len(heldout) == 634
    assert [{"prompt": r.prompt, **r.columns} for r in train] == problems("key-door-8", "train", 40)
    assert main(["task", "write", "guess-4", "--out", str(tmp_path / "g")]) == 0
    assert len(load_prompt_rows(str(tmp_path / "g" / "heldout.jsonl"))) == guess_number.POOL["heldout"]
    assert main(["task", "write", "key-door-40", "--out", str(tmp_path / "x")]) == 2
    assert "unknown task level 'key-door-40'" in capsys.readouterr().err


def test_a_summary_of_environment_records_has_the_valid_move_share():
    def record(model: str, prompt: int, correct: float, moves: int, valid: int) -> dict:
        return {"model": model, "run": None, "iteration": None, "prompt_index": prompt, "reply_index": 0,
                "correct": correct, "formatted": float(moves == valid), "finished": True, "tokens": 5, "kl": 0.0,
                "turns": moves, "tool_calls": 0, "tool_errors": 0, "moves": moves, "valid_moves": valid}

    (summary,) = summarize_task([record(START, 0, 1.0, 4, 4), record(START, 1, 0.0, 2, 1)], n_boot=200)
    assert summary["valid_moves"] == 5 / 6 and summary["accuracy"]["mean"] == 0.5 and summary["formatted"] == 0.5


def test_held_out_episodes_in_the_environment_on_a_tiny_model(tokenizer):
    from ppo_rlhf.tasks.evaluate import episode_records

    model = tiny.tiny_causal_lm(tokenizer, max_position_embeddings=1024)
    settings = {"temperature": 1.0, "max_new_tokens": 4, "top_p": 1.0, "max_turns": 16, "max_tool_calls": 4,
                "max_episode_tokens": 120, "tool_timeout": 10.0}
    for name in ("key-door-4", "guess-4"):
        rows = problems(name, "heldout", 3)
        found = [episode_records(model, tokenizer, rows, settings, 2, 5, 8, [], environment=task_environment(name))
                 for _ in range(2)]
        assert [r["transcript"] for r in found[0]] == [r["transcript"] for r in found[1]]  # seeded: the same episodes
        assert len(found[0]) == 6 and all(r["moves"] >= 1 and r["correct"] in (0.0, 1.0) for r in found[0])
        assert all(r["formatted"] == float(r["moves"] == r["valid_moves"]) for r in found[0])


class RecordedGuess(guess_number.GuessNumber):
    """The guess environment, remembering every secret it draws."""

    secrets: list[int] = []

    def reset(self, **row):
        super().reset(**row)
        RecordedGuess.secrets.append(self.secret)


def test_a_resumed_guess_run_draws_the_same_secrets(tiny_model_dirs, tmp_path):
    def run(out: str, iterations: int, resume: bool = False) -> list[int]:
        RecordedGuess.secrets = []
        config = PPOConfig(policy_model=str(tiny_model_dirs["policy"]), out=str(tmp_path / out),
                           iterations=iterations, batch_size=4, minibatch_size=2, epochs=1, max_new_tokens=4,
                           max_turns=4, max_episode_tokens=60, reward_norm_samples=4, lora_rank=4,
                           checkpoint_every=10, report_to=[], quiet=True, dtype="float32", device="cpu")
        PPOTrainer(config, reward_funcs=[horizon.environment_reward_only],
                   train_dataset=problems("guess-4", "train", 4), environment_factory=RecordedGuess,
                   resume=resume).train()
        return RecordedGuess.secrets

    whole = run("a", 3)
    run("b", 2)
    resumed = run("b", 3, resume=True)
    assert len(whole) == 4 + 3 * 4 and resumed == whole[-4:]  # the norm batch, 3 iterations; the third replayed
    assert len(set(whole)) > 1


@pytest.mark.parametrize("name, environment", [("key-door-16", "ppo_rlhf.tasks.key_door:environment"),
                                               ("guess-2", "ppo_rlhf.tasks.guess_number:environment")])
def test_the_demo_trains_an_environment_task_on_its_family_preset(tmp_path, name, environment):
    from ppo_rlhf.tasks.demo import train_config

    cfg = train_config(tmp_path, quick=False, overrides={}, task=name)
    assert cfg.environment == environment and cfg.reward_funcs == ["ppo_rlhf.tasks.horizon:environment_reward_only"]
    assert cfg.max_turns >= horizon.parse(name)[0].MAX_HORIZON and cfg.prompts == str(tmp_path / "data" / "train.jsonl")


@pytest.mark.smoke
def test_smollm2_plays_both_games_from_the_prompt():
    """The start policy makes valid moves and wins some games (bench/horizon_start.py measures it per horizon)."""
    import torch

    from ppo_rlhf.models.loading import load_causal_lm, load_tokenizer
    from ppo_rlhf.tasks.evaluate import episode_records

    tokenizer, model = load_tokenizer("smollm2"), load_causal_lm("smollm2", torch.float32)
    settings = {"temperature": 0.7, "max_new_tokens": 16, "top_p": 1.0, "max_turns": 16, "max_tool_calls": 4,
                "max_episode_tokens": 640, "tool_timeout": 10.0}
    for name in ("key-door-4", "guess-4"):
        found = episode_records(model, tokenizer, problems(name, "train", 16), settings, 1, 1234, 16, [],
                                environment=task_environment(name))
        assert sum(r["valid_moves"] for r in found) >= 0.7 * sum(r["moves"] for r in found), name
        assert any(r["correct"] for r in found), name
