"""`ppo-rlhf compare` on tiny models: one iteration per estimator, evaluated side by side."""

from __future__ import annotations

import json

from ppo_rlhf.cli import main

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
