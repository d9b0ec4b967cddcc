"""The public API (`from ppo_rlhf import PPOConfig, PPOTrainer`): reward functions, the critic without a reward model,
callbacks, resume, loaded models, save_model and push_to_hub, and the CLI as a thin layer over it. Tiny models."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from ppo_rlhf import PPOConfig, PPOTrainer, RewardFunctionError, UsageError
from ppo_rlhf.cli import main

import tiny

PROMPTS = ["Tell me a story", "Hello! How are you?", "What is the source of energy?", "Once upon a time",
           "I love this day", "The quick brown fox", "This is terrible", "A cat in a house"]
TIME_KEYS = ("time_gen", "time_score", "time_update", "time_total", "gen_tokens_per_s")


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("api")
    other = tiny.tiny_tokenizer(distinct_pad=True, vocab_size=280)  # another vocabulary than the policy's
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "answer": p.split()[0]}) + "\n" for p in PROMPTS))
    rewards = root / "my_rewards.py"
    rewards.write_text("def first_word(prompts, completions, completion_ids, answer, **columns):\n"
                       "    return [float(c.strip().startswith(a)) + 0.1 * len(ids) for c, a, ids in "
                       "zip(completions, answer, completion_ids)]\n")
    return {"policy": str(tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, root / "policy")),
            "reward": str(tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, root / "reward")),
            "other_rm": str(tiny.save_tiny(tiny.tiny_reward_model(other, seed=3), other, root / "other_rm")),
            "prompts": str(prompts), "rewards_file": str(rewards), "root": root}


def settings(models, out: Path, **overrides) -> dict:
    values = dict(policy_model=models["policy"], prompts=models["prompts"], out=str(out), iterations=2, batch_size=4,
                  minibatch_size=2, epochs=1, max_new_tokens=6, reward_norm_samples=8, lora_rank=4,
                  checkpoint_every=1, report_to=[], quiet=True, policy_lr=1e-3, value_lr=1e-3, dtype="float32")
    return values | overrides


def length(completions, **columns):
    """A reward function: the completion's length in characters."""
    return [float(len(c)) for c in completions]


def mentions_answer(prompts, completions, completion_ids, answer, **columns):
    """A reward function reading a dataset column; None (not applicable) for odd-length completions."""
    return [float(a.lower() in c.lower()) if len(c) % 2 == 0 else None for c, a in zip(completions, answer)]


def history(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (Path(run_dir) / "history.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIME_KEYS} for row in rows]


def test_a_callable_reward_and_dataset_columns(models, tmp_path):
    seen = []

    def answer_seen(prompts, completions, completion_ids, answer, **columns):
        seen.append((list(prompts), list(answer)))
        return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]

    dataset = [{"prompt": p, "answer": p.split()[0]} for p in PROMPTS]
    config = PPOConfig(**settings(models, tmp_path / "run", prompts=None, log_completions_every=1,
                                  advantage_estimator="rloo", group_size=2))
    trainer = PPOTrainer(config, reward_funcs=answer_seen, train_dataset=dataset)
    run_dir = trainer.train()
    rows = history(run_dir)
    assert len(rows) == 2 and all("reward/answer_seen" in row for row in rows)
    # every call saw each prompt's own column value, rows in step
    assert seen and all(answer == [p.split()[0] for p in prompts] for prompts, answer in seen)
    completions = [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]
    assert len(completions) == 2 * 4 and {"prompt", "completion", "score", "reward/answer_seen"} <= set(completions[0])
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["reward_funcs"] == ["<function test_a_callable_reward_and_dataset_columns.<locals>.answer_seen>"]
    assert saved["prompts"] is None and saved["resume"] is False


def test_two_functions_and_a_reward_model_with_another_tokenizer(models, tmp_path):
    config = PPOConfig(**settings(models, tmp_path / "run", reward_weights=[0.5, 1.0, 2.0]))
    trainer = PPOTrainer(config, reward_funcs=[length, mentions_answer, models["other_rm"]])
    loop = trainer.loop
    # the reward model reads texts with its own tokenizer, so the critic is the policy's base with a zero head
    assert loop.reward_model is not None and loop.reward_model.tokenizer.get_vocab() != loop.tokenizer.get_vocab()
    assert loop.critic.model is not loop.reward_model.model
    rollout = loop.rollout(loop.batch_prompts([0, 1, 2, 3]))
    total = loop.scoring.raw_scores(rollout)
    values = loop.scoring.batch_rewards.by_function
    assert list(values) == ["length", "mentions_answer", "other_rm"]
    for row in range(4):
        expected = 0.5 * values["length"][row] + 2.0 * values["other_rm"][row]
        if values["mentions_answer"][row] is not None:
            expected += values["mentions_answer"][row]
        assert float(total[row]) == pytest.approx(expected, rel=1e-6)
    rows = history(trainer.train())
    assert {"reward/length", "reward/mentions_answer", "reward/other_rm"} <= set(rows[-1])
    assert all(row["reward/length"] > 0 and 0 <= row["reward/mentions_answer"] <= 1 for row in rows)


def test_rloo_with_functions_alone_loads_only_the_policy(models, tmp_path, monkeypatch):
    import ppo_rlhf.models.loading

    class NoClassifiers:
        def __getattr__(self, name):
            raise AssertionError("a sequence classifier was loaded")

    monkeypatch.setattr(ppo_rlhf.models.loading, "AutoModelForSequenceClassification", NoClassifiers())
    config = PPOConfig(**settings(models, tmp_path / "run", advantage_estimator="rloo", group_size=2))
    trainer = PPOTrainer(config, reward_funcs=[length])
    loop = trainer.loop
    assert loop.critic is None and loop.reward_model is None and trainer.value_model is None
    assert set(loop.models) == {"policy"}
    assert len(history(trainer.train())) == 2


def test_the_critic_without_a_reward_model_starts_at_zero(models, tmp_path):
    from ppo_rlhf.models.loading import backbone_and_head, load_causal_lm

    trainer = PPOTrainer(PPOConfig(**settings(models, tmp_path / "run")), reward_funcs=[length])
    critic = trainer.loop.critic
    body, head = backbone_and_head(critic.model)
    assert all(bool((p == 0).all()) for p in head.parameters())
    rollout = trainer.loop.rollout(PROMPTS[:4])
    assert bool((critic.values(rollout.input_ids, rollout.attention_mask) == 0).all())
    # its body is the policy's base, with a LoRA adapter of its own
    base = load_causal_lm(models["policy"])
    with critic.model.disable_adapter():
        torch.testing.assert_close(body.embed_tokens.weight, base.model.embed_tokens.weight, rtol=0, atol=0)
    assert any("lora" in name for name, p in critic.model.named_parameters() if p.requires_grad)
    run_dir = trainer.train()
    assert (run_dir / "checkpoints" / "iter_000002" / "value" / "adapter_model.safetensors").is_file()
    rows = history(run_dir)
    assert all(row["v_loss"] == row["v_loss"] for row in rows)  # a critic trained (finite value loss)
    assert any(not bool((p == 0).all()) for p in head.parameters())  # its head moved


def test_the_zero_head_critic_in_bfloat16(models, tmp_path):
    """Frozen weights stored in bf16: the critic's body is still exactly the policy's base, its head zero and fp32."""
    from ppo_rlhf.models.loading import backbone_and_head

    trainer = PPOTrainer(PPOConfig(**settings(models, tmp_path / "run", dtype="bfloat16")), reward_funcs=[length])
    body, head = backbone_and_head(trainer.value_model)
    policy_body = trainer.model.get_base_model().model
    assert body.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.equal(body.embed_tokens.weight, policy_body.embed_tokens.weight)
    assert all(p.dtype == torch.float32 and bool((p == 0).all()) for p in head.parameters() if p.requires_grad)
    rollout = trainer.loop.rollout(PROMPTS[:2])
    assert bool((trainer.loop.critic.values(rollout.input_ids, rollout.attention_mask) == 0).all())


def test_a_value_model_folder(models, tmp_path):
    trainer = PPOTrainer(PPOConfig(**settings(models, tmp_path / "run", value_model=models["reward"])),
                         reward_funcs=[length])
    assert trainer.loop.critic is not None and trainer.loop.reward_model is None
    with pytest.raises(UsageError, match="value_model .* policy's tokenizer"):
        PPOTrainer(PPOConfig(**settings(models, tmp_path / "bad", value_model=models["other_rm"])),
                   reward_funcs=[length])


class Recorder:
    def __init__(self, log: list, name: str, stop_at: int | None = None):
        self.log, self.name, self.stop_at = log, name, stop_at

    def on_train_begin(self, trainer):
        assert isinstance(trainer, PPOTrainer)
        self.log.append((self.name, "begin"))

    def on_iteration_end(self, trainer, stats):
        self.log.append((self.name, "iteration", stats["iteration"]))
        return stats["iteration"] == self.stop_at or None

    def on_train_end(self, trainer):
        self.log.append((self.name, "end"))


class OnlyIterations:
    def __init__(self, log: list):
        self.log = log

    def on_iteration_end(self, trainer, stats):
        self.log.append(("second", "iteration", stats["iteration"]))


def test_report_to_and_completions_reach_the_trackers(models, tmp_path, monkeypatch):
    import ppo_rlhf.ppo.trackers

    calls = []

    class FakeWandb:  # stands in for the wandb tracker: what the run sends it, no network
        def __init__(self, run_dir, config, first_iteration, run_name):
            calls.append(("start", config["reward_funcs"], first_iteration))

        def log(self, stats, step):
            calls.append(("log", step, stats["iteration"], "reward/length" in stats))

        def log_table(self, key, columns, rows, step):
            calls.append(("table", key, step, len(rows), "reward/length" in columns))

        def close(self):
            calls.append(("close",))

    monkeypatch.setitem(ppo_rlhf.ppo.trackers.MAKERS, "wandb", FakeWandb)
    config = PPOConfig(**settings(models, tmp_path / "run", report_to=["wandb", "tensorboard"], iterations=3,
                                  advantage_estimator="rloo", group_size=2, log_completions_every=2))
    run_dir = PPOTrainer(config, reward_funcs=[length]).train()
    assert calls == [("start", [f"{__name__}:length"], 0), ("log", 0, 0, True), ("table", "completions", 0, 4, True),
                     ("log", 1, 1, True), ("log", 2, 2, True), ("table", "completions", 2, 4, True), ("close",)]
    assert any((run_dir / "tb").iterdir())
    lines = (run_dir / "completions.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [0] * 4 + [2] * 4


def test_callbacks_are_called_in_order(models, tmp_path):
    log: list = []
    config = PPOConfig(**settings(models, tmp_path / "run", advantage_estimator="rloo", group_size=2))
    PPOTrainer(config, reward_funcs=[length], callbacks=[Recorder(log, "first"), OnlyIterations(log)]).train()
    assert log == [("first", "begin"), ("first", "iteration", 0), ("second", "iteration", 0),
                   ("first", "iteration", 1), ("second", "iteration", 1), ("first", "end")]


def test_a_function_reward_run_with_the_new_critic_resumes_to_the_same_history(models, tmp_path):
    common = dict(iterations=4, checkpoint_every=10, advantage_estimator="gae")  # (no checkpoint before the last)
    whole = PPOTrainer(PPOConfig(**settings(models, tmp_path / "a", **common)), reward_funcs=[length]).train()

    log: list = []
    stopped = PPOTrainer(PPOConfig(**settings(models, tmp_path / "b", **common)), reward_funcs=[length],
                         callbacks=[Recorder(log, "stopper", stop_at=1)])
    run_dir = stopped.train()
    assert log[-1] == ("stopper", "end") and len(history(run_dir)) == 2
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "iter_000002"  # written for the stop

    PPOTrainer(PPOConfig(**settings(models, tmp_path / "b", **common)), reward_funcs=[length], resume=True).train()
    assert history(tmp_path / "b") == history(whole)


def test_cli_and_api_give_the_same_history(models, tmp_path):
    spec = f"{models['rewards_file']}:first_word"
    values = settings(models, tmp_path / "cli", reward_model=models["reward"], reward_funcs=[spec],
                      reward_weights=[1.0, 0.5])
    path = tmp_path / "cli.yaml"
    path.write_text(yaml.safe_dump(values))
    assert main(["train", "--config", str(path)]) == 0
    sys.path.insert(0, str(Path(models["rewards_file"]).parent))
    try:
        from my_rewards import first_word
    finally:
        sys.path.pop(0)
    api = PPOConfig(**{**values, "out": str(tmp_path / "api"), "reward_funcs": []})
    run_dir = PPOTrainer(api, reward_funcs=[first_word]).train()
    assert history(run_dir) == history(tmp_path / "cli")
    assert "reward/first_word" in history(run_dir)[0] and "reward/reward" in history(run_dir)[0]
    # config.yaml names the reward file by its absolute path: `--resume` finds it from any directory
    saved = yaml.safe_load((tmp_path / "cli" / "config.yaml").read_text())
    assert saved["reward_funcs"] == [f"{Path(models['rewards_file']).resolve()}:first_word"]
    assert main(["train", "--resume", str(tmp_path / "cli"), "--iterations", "3"]) == 0
    assert len(history(tmp_path / "cli")) == 3 and history(tmp_path / "cli")[:2] == history(run_dir)


def test_list_fields_from_yaml_flags_and_python(models, tmp_path, capsys):
    from ppo_rlhf.cli import OneLineParser
    from ppo_rlhf.config import build_config, to_yaml
    from ppo_rlhf.train import add_arguments

    parser = OneLineParser()
    add_arguments(parser)
    args = parser.parse_args(["--reward-funcs", "a.py:f", "runs/rm", "--reward-weights", "1", "0.5",
                              "--report-to", "none"])
    assert args.reward_funcs == ["a.py:f", "runs/rm"] and args.reward_weights == [1.0, 0.5]
    config = build_config(PPOConfig, {"reward_funcs": "m:f", "tensorboard": False})  # one item alone; an old key
    assert config.reward_funcs == ["m:f"] and config.trackers == []
    assert build_config(PPOConfig, yaml.safe_load(to_yaml(config))) == config
    for bad, message in [({"reward_weights": [1, "x"]}, "reward_weights: expected a list"),
                         ({"reward_funcs": [""]}, "reward_funcs: expected a list"),
                         ({"report_to": ["tensorbored"]}, "report_to: expected a list"),
                         ({"reward_weights": {"a": 1}}, "reward_weights: expected")]:
        with pytest.raises(UsageError, match=message):
            build_config(PPOConfig, bad)
        with pytest.raises(UsageError, match=message):  # the same check, the same line, in Python
            PPOConfig(**bad)
    argv = ["train", "--policy-model", models["policy"], "--prompts", models["prompts"], "--out", str(tmp_path / "r"),
            "--reward-funcs", "x.py:f", "--quiet"]
    assert main([*argv, "--reward-weights", "1", "nan"]) == 2
    assert "reward_weights: expected" in capsys.readouterr().err
    assert main([*argv, "--reward-weights", "1", "2"]) == 2
    assert "reward_weights has 2 weights for 1 rewards" in capsys.readouterr().err
    assert main(argv) == 2  # the file is checked before anything loads
    err = capsys.readouterr().err.strip()
    assert "x.py" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_sample_no_function_scores_is_one_line(models, tmp_path, capsys):
    def never(completions, **columns):
        return [None] * len(completions)

    with pytest.raises(RewardFunctionError, match="no reward function \\(never\\) scored the completion"):
        PPOTrainer(PPOConfig(**settings(models, tmp_path / "run", advantage_estimator="rloo", group_size=2)),
                   reward_funcs=[never]).train()


def test_a_failing_function_stops_the_run_with_its_checkpoint_intact(models, tmp_path, capsys):
    from ppo_rlhf.ppo.checkpoint import latest_checkpoint

    broken = {"now": False}

    def fragile(completions, **columns):
        if broken["now"]:
            raise ValueError("cannot parse")
        return [1.0] * len(completions)

    class BreakAfterFirst:
        def on_iteration_end(self, trainer, stats):
            broken["now"] = True

    config = PPOConfig(**settings(models, tmp_path / "run", iterations=3, advantage_estimator="rloo", group_size=2))
    with pytest.raises(RewardFunctionError) as error:
        PPOTrainer(config, reward_funcs=[fragile], callbacks=[BreakAfterFirst()]).train()
    text = str(error.value)
    assert len(text.splitlines()) == 1 and "reward function fragile raised ValueError: cannot parse" in text
    assert "the completion " in text and text.endswith("latest checkpoint iter_000001")
    assert latest_checkpoint(tmp_path / "run", ("policy",)).name == "iter_000001"
    assert len(history(tmp_path / "run")) == 1
    # the CLI: the same line on stderr, exit 2
    bad = tmp_path / "bad.py"
    bad.write_text("def boom(completions, **kw):\n    raise RuntimeError('no')\n")
    argv = ["train", "--policy-model", models["policy"], "--prompts", models["prompts"], "--out",
            str(tmp_path / "cli"), "--reward-funcs", f"{bad}:boom", "--quiet", "--reward-norm-samples", "4"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "reward function boom raised RuntimeError: no" in err


def test_a_loaded_policy_and_its_tokenizer(models, tmp_path, tokenizer):
    policy = tiny.tiny_causal_lm(tokenizer)  # built in memory: no folder to load a tokenizer from
    config = PPOConfig(**settings(models, tmp_path / "run", iterations=1, advantage_estimator="rloo", group_size=2))
    with pytest.raises(UsageError, match="processing_class"):
        PPOTrainer(config, reward_funcs=[length], policy_model=policy)
    trainer = PPOTrainer(config, reward_funcs=[length], policy_model=policy, processing_class=tokenizer)
    assert trainer.model.get_base_model() is policy
    assert len(history(trainer.train())) == 1


def test_save_model_and_push_to_hub(models, tmp_path, monkeypatch):
    import huggingface_hub
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    uploads = []

    class FakeHub:
        def create_repo(self, repo_id, private=False, exist_ok=False):
            return f"https://huggingface.co/{repo_id}"

        def upload_folder(self, repo_id, folder_path, commit_message=""):
            uploads.append((repo_id, sorted(p.name for p in Path(folder_path).iterdir())))

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHub)
    config = PPOConfig(**settings(models, tmp_path / "run", iterations=1, advantage_estimator="rloo", group_size=2,
                                  push_to_hub="me/tiny-ppo"))
    trainer = PPOTrainer(config, reward_funcs=[length])
    trainer.train()
    assert uploads and uploads[0][0] == "me/tiny-ppo" and "adapter_config.json" in uploads[0][1]
    adapter = trainer.save_model(tmp_path / "adapter")
    merged = trainer.save_model(tmp_path / "merged", merge=True)
    assert "reward" in (adapter / "README.md").read_text() and "length" in (adapter / "README.md").read_text()
    ids = torch.tensor([[1, 5, 9, 12]])
    with torch.no_grad():
        expected = trainer.model(input_ids=ids).logits
        base = AutoModelForCausalLM.from_pretrained(models["policy"])
        loaded = PeftModel.from_pretrained(base, adapter)(input_ids=ids).logits
        plain = AutoModelForCausalLM.from_pretrained(merged)(input_ids=ids).logits
    torch.testing.assert_close(loaded, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(plain, expected, rtol=1e-4, atol=1e-5)
    assert AutoTokenizer.from_pretrained(merged).get_vocab() == trainer.processing_class.get_vocab()


def test_chat_message_prompts(models, tmp_path):
    seen = []

    def record(prompts, completions, **columns):
        seen.append((prompts[0], completions[0]))
        return [0.0] * len(completions)

    dataset = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": p}]}
               for p in PROMPTS]
    config = PPOConfig(**settings(models, tmp_path / "run", prompts=None, prompt_column="messages", iterations=1,
                                  advantage_estimator="rloo", group_size=2))
    PPOTrainer(config, reward_funcs=[record], train_dataset=dataset).train()
    prompt, completion = seen[-1]
    assert isinstance(prompt, list) and prompt[0]["role"] == "system"
    assert isinstance(completion, list) and completion[0]["role"] == "assistant"


def test_objects_in_the_config_say_where_they_go(tokenizer):
    with pytest.raises(UsageError, match="PPOTrainer\\(config, policy_model=model, processing_class=tokenizer\\)"):
        PPOConfig(policy_model=tiny.tiny_causal_lm(tokenizer))
    with pytest.raises(UsageError, match="reward_funcs: functions and loaded models go to the trainer"):
        PPOConfig(reward_funcs=[length])


def test_missing_inputs_are_one_line_before_loading(models, tmp_path):
    with pytest.raises(UsageError, match="reward_model or reward_funcs is required"):
        PPOTrainer(PPOConfig(**settings(models, tmp_path / "run")))
    with pytest.raises(UsageError, match=r"prompts are required: PPOTrainer\(config, train_dataset=\.\.\.\)"):
        PPOTrainer(PPOConfig(**settings(models, tmp_path / "run", prompts=None)), reward_funcs=[length])
    with pytest.raises(UsageError, match="reward_weights has 1 weights for 2 rewards"):
        PPOTrainer(PPOConfig(**settings(models, tmp_path / "run", reward_weights=[1.0])),
                   reward_funcs=[length, mentions_answer])
    assert not (tmp_path / "run").exists()


def test_the_readme_example_runs(models, tmp_path):
    import importlib.util

    path = Path(__file__).parent.parent / "examples" / "own_reward.py"
    assert len(path.read_text().splitlines()) <= 25
    spec = importlib.util.spec_from_file_location("own_reward", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    tiny_settings = settings(models, tmp_path / "run", iterations=3, critic_warmup_iterations=1)
    del tiny_settings["prompts"]
    folder = example.main(**tiny_settings)
    rows = history(tmp_path / "run")
    assert [row["phase"] for row in rows] == ["critic-warmup", "policy", "policy"]
    assert {"reward/correct", "reward/brief"} <= set(rows[0]) and (folder / "adapter_config.json").is_file()


@pytest.mark.smoke
def test_a_function_reward_on_smollm2(tmp_path):
    def short(completions, **columns):
        return [-float(len(c)) / 100 for c in completions]

    config = PPOConfig(policy_model="smollm2", out=str(tmp_path / "run"), iterations=2, batch_size=4,
                       minibatch_size=2, epochs=1, max_new_tokens=16, reward_norm_samples=4, quiet=True, report_to=[])
    run_dir = PPOTrainer(config, reward_funcs=[short], train_dataset=PROMPTS).train()
    rows = history(run_dir)
    assert len(rows) == 2 and rows[0]["kl"] == 0.0 and "reward/short" in rows[0]


def large_mean(completions, **columns):
    """A reward function whose mean is far from 0 and whose spread is small: 3 + 0.1 x characters."""
    return [3.0 + 0.1 * len(c) for c in completions]


def test_a_cold_critic_starts_at_zero_on_the_normalised_scale(models, tmp_path):
    """A cold critic (reward functions only, no value_model) has a zero head, so its first values must be 0 on the
    normalised scale and its first advantages the rewards minus zero. Read through the reward's start statistics they
    began at -mean/std for every token, and with lambda < 1 the advantages of a reply ramped with position."""
    from ppo_rlhf.ppo.run import start_or_resume

    trainer = PPOTrainer(PPOConfig(**settings(models, tmp_path / "run", reward_norm_samples=16, lam=0.9)),
                         reward_funcs=[large_mean])
    loop = trainer.loop
    assert loop.critic_scale == "identity"
    (tmp_path / "run").mkdir()
    start_or_resume(loop, tmp_path / "run", resume=False, log=lambda line: None)
    norm = json.loads((tmp_path / "run" / "reward_norm.json").read_text())
    assert norm["mean"] / norm["std"] > 3 and (norm["value_mean"], norm["value_std"]) == (0.0, 1.0)
    assert loop.value_norm == (0.0, 1.0)
    experience = loop.score(loop.rollout(loop.batch_prompts([0, 1, 2, 3])))
    act = experience.action_mask.bool()
    assert float(experience.old_values[act].abs().max()) == 0.0
    # with V = 0 the only per-token rewards before the last token are the KL penalty's (0 at the start, where the
    # policy is the reference): every token of a reply has the same raw advantage, lambda^k times the score
    lengths = act.sum(1)
    for row in range(len(lengths)):
        raw = experience.raw_advantages[row][act[row]]
        expected = experience.scores[row] * 0.9 ** torch.arange(int(lengths[row]) - 1, -1, -1, dtype=raw.dtype)
        assert torch.allclose(raw, expected, atol=1e-5), (raw, expected)
    # a resumed run reads its file: one begun before cold critics had statistics (no value_mean) keeps reading its
    # values through the reward's, as it was trained
    old = PPOConfig(**settings(models, tmp_path / "old", iterations=1, reward_norm_samples=16))
    PPOTrainer(old, reward_funcs=[large_mean]).train()
    norm_file = tmp_path / "old" / "reward_norm.json"
    norm = {k: v for k, v in json.loads(norm_file.read_text()).items() if not k.startswith("value_")}
    norm_file.write_text(json.dumps(norm))
    resumed = PPOTrainer(PPOConfig(**settings(models, tmp_path / "old", iterations=2, reward_norm_samples=16)),
                         reward_funcs=[large_mean], resume=True)
    resumed.train()
    assert resumed.loop.value_norm is None and len(history(tmp_path / "old")) == 2


def test_a_value_model_folder_is_normalised_by_its_own_start_values(models, tmp_path):
    """A named value model was trained on another reward: normalised by the reward's start statistics, its values
    would sit sd away from the normalised scores and bias every reply's last token (issue 43's gold and length arms);
    by its own, its start values centre on the scores' scale."""
    trainer = PPOTrainer(PPOConfig(**settings(models, tmp_path / "run", value_model=models["reward"], iterations=1,
                                              reward_norm_samples=16)), reward_funcs=[length])
    trainer.train()
    norm = json.loads((tmp_path / "run" / "reward_norm.json").read_text())
    loop = trainer.loop
    assert loop.value_norm == (norm["value_mean"], norm["value_std"]) and norm["value_std"] > 0
    torch.manual_seed(0)
    raw = torch.cat([loop.last_token_values(loop.rollout(PROMPTS)) for _ in range(4)])
    own = loop.scoring.normalised_values(raw).mean().abs()
    by_reward = loop.scoring.normalised(raw).mean().abs()  # the old map: the length reward's mean is characters
    assert by_reward > 3 * own and own < 1.5, (float(own), float(by_reward))
    # the reward model as the critic (value_model null) keeps the reward's statistics, as before
    shared = PPOTrainer(PPOConfig(**settings(models, tmp_path / "shared", reward_model=models["reward"],
                                             iterations=1)))
    shared.train()
    assert shared.loop.value_norm is None
    assert "value_mean" not in json.loads((tmp_path / "shared" / "reward_norm.json").read_text())


def test_hints_from_python_name_the_api_and_sigterm_keeps_the_checkpoint(models, tmp_path):
    """A run built in Python and stopped (here by SIGTERM, as Ctrl-C) says how to continue it in Python, not with a
    command that could not rebuild its reward functions; a second trainer on the used folder names resume= and
    overwrite=; SIGTERM's handler is restored after the run."""
    import os
    import signal

    from ppo_rlhf.errors import Interrupted
    from ppo_rlhf.utils.signals import by_sigterm

    class TerminatedInTheSecond:
        def on_iteration_end(self, trainer, stats):
            if len(trainer.history) == 2:  # (iteration 1's checkpoint is written after the callbacks)
                os.kill(os.getpid(), signal.SIGTERM)

    config = PPOConfig(**settings(models, tmp_path / "run", iterations=2, checkpoint_every=1))
    with pytest.raises(Interrupted) as stopped:
        PPOTrainer(config, reward_funcs=[length], callbacks=[TerminatedInTheSecond()]).train()
    assert str(stopped.value) == ("the latest checkpoint is iter_000001; continue with: PPOTrainer(config, ..., "
                                  "resume=True).train() with the same rewards and dataset")
    assert by_sigterm(stopped.value) and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with pytest.raises(UsageError) as refused:
        PPOTrainer(config, reward_funcs=[length])
    assert str(refused.value) == (f"run directory {tmp_path / 'run'} is not empty; use PPOTrainer(config, ..., "
                                  "resume=True) to continue it or PPOConfig(..., overwrite=True) to replace it")
    PPOTrainer(config, reward_funcs=[length], resume=True).train()
    assert len(history(tmp_path / "run")) == 2


def test_a_reward_that_fails_at_the_start_leaves_no_run_directory(models, tmp_path):
    def wrong_length(completions, **columns):
        return [1.0]

    config = PPOConfig(**settings(models, tmp_path / "run"))
    with pytest.raises(RewardFunctionError, match="returned 1 values"):
        PPOTrainer(config, reward_funcs=[wrong_length]).train()
    assert not (tmp_path / "run").exists()
    PPOTrainer(config, reward_funcs=[length]).train()  # the same config, once the reward is fixed
    assert len(history(tmp_path / "run")) == 2


def test_a_start_where_few_replies_finish_says_what_the_eos_rule_does(models, tmp_path, capsys):
    """Start replies cut at the cap: the EOS rule gives each -1 and the reward barely reaches PPO; one line says so
    (even quiet). A reward that gives every start reply the same score: the normalisation says std 0, not a measured
    1."""
    PPOTrainer(PPOConfig(**settings(models, tmp_path / "cut", max_new_tokens=1, iterations=1)),
               reward_funcs=[length]).train()
    assert capsys.readouterr().err.splitlines() == [  # (one of the 8 replies is EOS at once)
        "warning: only 12% of 8 start-policy replies finished within max_new_tokens=1: with eos_rule on, every "
        "unfinished reply scores unfinished_score=-1 instead of its reward, so the reward barely reaches PPO; raise "
        "max_new_tokens, or set eos_rule false"]

    def zero(completions, **columns):
        return [0.0] * len(completions)

    PPOTrainer(PPOConfig(**settings(models, tmp_path / "same", iterations=1, eos_rule=False, quiet=False)),
               reward_funcs=[zero]).train()
    printed = capsys.readouterr()
    note = "std 0: all 8 replies scored the same; scores are shifted, not scaled"
    assert f"start-policy replies: mean +0.000 {note} (finished" in printed.out and "warning" not in printed.err
    norm = json.loads((tmp_path / "same" / "reward_norm.json").read_text())
    assert (norm["std"], norm["note"]) == (0.0, note)
