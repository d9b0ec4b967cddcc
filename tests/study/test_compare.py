"""`ppo-rlhf compare` on tiny models: one iteration per estimator, evaluated side by side."""

from __future__ import annotations

import json

import pytest
import yaml

from ppo_rlhf.cli import main
from ppo_rlhf.tasks.compare import compare_sentence

import tiny


def test_compare_three_estimators(tmp_path, tokenizer, capsys):
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, tmp_path / "policy")
    reward = tiny.save_tiny(tiny.tiny_reward_model(tokenizer), tokenizer, tmp_path / "reward")
    gold = tiny.save_tiny(tiny.tiny_reward_model(tokenizer, seed=5), tokenizer, tmp_path / "gold")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["Tell me a story", "Hello!", "A cat", "Hi"]))
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["Once upon a time", "The quick fox"]))
    out = tmp_path / "cmp"
    code = main(["compare", "--policy-model", str(policy), "--reward-model", str(reward), "--prompts", str(prompts),
                 "--out", str(out), "--eval-prompts", str(held_out), "--gold", f"rm:{gold}", "--iterations", "1",
                 "--batch-size", "4", "--minibatch-size", "4", "--epochs", "1", "--max-new-tokens", "4",
                 "--reward-norm-samples", "4", "--lora-rank", "2", "--quiet", "--no-tensorboard",
                 "--replies-per-prompt", "1"])
    assert code == 0
    text = capsys.readouterr().out
    for name in ("start", "gae step 1", "rloo step 1", "grpo step 1"):
        assert name in text, text
    for name in ("gae", "rloo", "grpo"):
        assert (out / name / "checkpoints" / "iter_000001" / "policy").is_dir()
        saved = (out / name / "config.yaml").read_text()
        assert f"advantage_estimator: {name}" in saved and "group_size: 2" in saved
    assert (out / "gae" / "checkpoints" / "iter_000001" / "value").is_dir()
    assert not (out / "rloo" / "checkpoints" / "iter_000001" / "value").exists()
    summary = json.loads((out / "compare.json").read_text())["summary"]
    assert [s["model"] for s in summary] == ["start", "gae step 1", "rloo step 1", "grpo step 1"]
    assert all("proxy_change" in s and "gold_change" in s for s in summary)


# ---------------------------------------------------------------- --task: ppo, ppo-warmup, rloo, grpo on add-tiny


def test_compare_task_trains_each_variant_in_its_own_process(tmp_path, tiny_model_dirs, capsys):
    out = tmp_path / "cmp"
    args = ["compare", "--task", "add-tiny", "--out", str(out), "--policy-model", str(tiny_model_dirs["policy"]),
            "--iterations", "4", "--batch-size", "4", "--minibatch-size", "2", "--max-new-tokens", "6",
            "--reward-norm-samples", "4", "--lora-rank", "4", "--dtype", "float32", "--device", "cpu", "--quiet",
            "--report-to", "none", "--heldout", "4", "--checkpoint-every", "2", "--checkpoints", "2,4"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    for path in ("compare.txt", "compare.json", "compare.png", "evaluation/task_eval.json", "data/train.jsonl"):
        assert (out / path).is_file(), path
    result = json.loads((out / "compare.json").read_text())
    assert list(result["variants"]) == ["ppo", "ppo-warmup", "rloo", "grpo"]
    expected = {"ppo": ("gae", 0), "ppo-warmup": ("gae", 3), "rloo": ("rloo", 0), "grpo": ("grpo", 0)}
    for name, (estimator, warmup) in expected.items():
        config = yaml.safe_load((out / name / "config.yaml").read_text())
        assert (config["advantage_estimator"], config["critic_warmup_iterations"]) == (estimator, warmup)
        assert config["group_size"] == 2 and config["batch_size"] == 4 and config["max_new_tokens"] == 6
        assert config["reward_funcs"] == ["ppo_rlhf.tasks.arithmetic:exact_match",
                                          "ppo_rlhf.tasks.arithmetic:answer_format"]  # the preset
        process = json.loads((out / name / "process.json").read_text())
        assert process["peak_rss_mib"] > 50 and process["wall_s"] > 0  # the child's own peak (a Python with torch)
        variant = result["variants"][name]
        assert [point["iteration"] for point in variant["curve"]] == [0, 2, 4]
        history = [json.loads(line) for line in (out / name / "history.jsonl").read_text().splitlines()]
        tokens = sum(row["len"] for row in history) * 4  # mean reply tokens x replies per iteration
        assert variant["curve"][-1]["tokens"] == pytest.approx(tokens) == variant["sampled_tokens"]
        assert variant["seconds_per_iteration"] == pytest.approx(sum(r["time_total"] for r in history) / 4)
    # the same prompts for every variant (the same group size and seed)
    prompts = {name: [json.loads(row)["prompt"] for row in (out / name / "completions.jsonl").read_text().splitlines()]
               for name in expected}
    assert all(p == prompts["ppo"] for p in prompts.values())
    text = (out / "compare.txt").read_text()
    assert result["sentence"] in text and result["sentence"] in printed and "peak RSS MiB" in text
    evaluation = json.loads((out / "evaluation" / "task_eval.json").read_text())
    assert [s["model"] for s in evaluation["summary"]] == ["start"] + [f"{name} step {i}" for name in expected
                                                                     for i in (2, 4)]
    assert main(args) == 0  # done: every stage skipped, the table written again from the stored results
    printed = capsys.readouterr().out
    assert "[train grpo] done already, skipping" in printed and "[evaluation] done already, skipping" in printed


def test_compare_task_calc_steps_counts_the_policys_tokens_of_multi_turn_episodes(tmp_path, tiny_model_dirs,
                                                                                  capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--task", "calc-steps", "--variants", "ppo,grpo", "--out", str(out), "--policy-model",
                 str(tiny_model_dirs["policy"]), "--iterations", "2", "--batch-size", "4", "--minibatch-size", "2",
                 "--max-new-tokens", "6", "--max-episode-tokens", "40", "--reward-norm-samples", "4", "--lora-rank",
                 "4", "--dtype", "float32", "--device", "cpu", "--quiet", "--report-to", "none", "--heldout", "4",
                 "--checkpoint-every", "2", "--checkpoints", "2"]) == 0
    capsys.readouterr()
    result = json.loads((out / "compare.json").read_text())
    for name in ("ppo", "grpo"):
        config = yaml.safe_load((out / name / "config.yaml").read_text())
        assert config["tools"] == ["ppo_rlhf.tasks.calc_steps:calc"] and config["max_turns"] == 3  # the preset's
        history = [json.loads(line) for line in (out / name / "history.jsonl").read_text().splitlines()]
        policy_tokens = sum(row["len"] * (1 - row["masked_share"]) for row in history) * 4
        assert result["variants"][name]["sampled_tokens"] == pytest.approx(policy_tokens)
    evaluation = json.loads((out / "evaluation" / "task_eval.json").read_text())
    assert all("tool_use" in s for s in evaluation["summary"]) and evaluation["settings"]["max_turns"] == 3


def variant(accuracy: float) -> dict:
    return {"accuracy": {"mean": accuracy, "lo": accuracy - 0.06, "hi": accuracy + 0.06}, "iteration": 30}


def test_compare_sentence_names_the_best_and_each_difference():
    variants = {"ppo": variant(0.70), "ppo-warmup": variant(0.66), "rloo": variant(0.50), "grpo": variant(0.72)}
    differences = {"ppo": {"mean": -0.02, "lo": -0.08, "hi": 0.04}, "ppo-warmup": {"mean": -0.06, "lo": -0.12,
                                                                                  "hi": 0.005},
                   "rloo": {"mean": -0.22, "lo": -0.3, "hi": -0.14}}
    sentence = compare_sentence(variants, "grpo", differences)
    assert sentence.startswith("grpo had the highest final held-out accuracy, 72.0% [66.0, 78.0] after 30 iterations.")
    assert "ppo -2.0 [-8.0, +4.0] points (includes zero)" in sentence
    assert "ppo-warmup -6.0 [-12.0, +0.5] points (includes zero)" in sentence
    assert "rloo -22.0 [-30.0, -14.0] points (excludes zero)" in sentence
    assert sentence.endswith("grpo did better than rloo; ppo, ppo-warmup cannot be told apart from it on these "
                             "problems.")
    apart = {name: {"mean": -0.2, "lo": -0.3, "hi": -0.1} for name in differences}
    assert compare_sentence(variants, "grpo", apart).endswith("Every difference excludes zero: grpo did better than "
                                                              "each of the others.")
    close = {name: {"mean": 0.0, "lo": -0.1, "hi": 0.1} for name in differences}
    assert compare_sentence(variants, "grpo", close).endswith("No difference excludes zero: on these problems no "
                                                              "variant is shown to beat another.")
    tied = {**variants, "ppo": variant(0.72)}
    assert compare_sentence(tied, "grpo", close).startswith("grpo and ppo tied for the highest final")


@pytest.mark.parametrize("flags, message", [
    (["--task", "add-tiny", "--gold", "vader"], "--gold: no meaning with --task"),
    (["--task", "add-tiny", "--group-size", "4", "--advantage-estimator", "rloo"],
     "--advantage-estimator, --group-size: no meaning with --task"),
    (["--task", "add-tiny", "--checkpoints", "12,20"], "--checkpoints 12: the runs save a checkpoint every 5"),
    (["--task", "add-tiny", "--variants", "ppo,dpo"], "--variants must be distinct names from ppo, ppo-warmup"),
    (["--task", "add-huge"], "unknown task level 'add-huge'"),
    (["--checkpoints", "10", "--eval-prompts", "x.jsonl"], "--checkpoints: only with --task"),
])
def test_compare_refuses_flags_with_no_meaning(tmp_path, monkeypatch, capsys, flags, message):
    def refused(*args, **kwargs):
        raise AssertionError("refused before any stage (else this test would train SmolLM2)")

    monkeypatch.setattr("ppo_rlhf.tasks.compare.Stages", refused)
    assert main(["compare", "--out", str(tmp_path / "cmp"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "cmp").exists()


def test_sigterm_stops_compare_as_ctrl_c_does(tmp_path, tokenizer, monkeypatch, capsys):
    import os
    import signal

    import ppo_rlhf.study.compare as compare_module

    def terminated(cfg, resume=False):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(compare_module, "train", terminated)
    policy = tiny.save_tiny(tiny.tiny_causal_lm(tokenizer), tokenizer, tmp_path / "policy")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hello"}) + "\n")
    assert main(["compare", "--policy-model", str(policy), "--reward-model", str(policy), "--prompts", str(prompts),
                 "--eval-prompts", str(prompts), "--out", str(tmp_path / "cmp")]) == 143
    assert capsys.readouterr().err.splitlines()[-1] == "ppo-rlhf compare: terminated (SIGTERM)"
