"""Held-out accuracy on the verifiable task (ppo_rlhf/tasks/evaluate.py): the summary's intervals on made-up records,
and a tiny run's start policy and checkpoints evaluated on held-out problems."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from ppo_rlhf import PPOConfig, PPOTrainer
from ppo_rlhf.errors import UsageError
from ppo_rlhf.study.evaluate import START
from ppo_rlhf.tasks.arithmetic import exact_match, problems
from ppo_rlhf.tasks.evaluate import evaluate_task_runs, summarize_task


def record(model: str, prompt: int, reply: int, correct: float, kl: float = 0.0) -> dict:
    return {"model": model, "run": None if model == START else "run", "iteration": None if model == START else 5,
            "prompt_index": prompt, "reply_index": reply, "correct": correct, "formatted": 1.0, "finished": True,
            "tokens": 10, "kl": kl}


def test_summary_pairs_replies_and_resamples_whole_problems():
    start = [record(START, p, r, float(p == 0)) for p in range(20) for r in range(2)]
    trained = [record("run step 5", p, r, float(p < 10), kl=2.0) for p in range(20) for r in range(2)]
    first, second = summarize_task(start + trained, n_boot=2000)
    assert first["model"] == START and first["accuracy"]["mean"] == pytest.approx(0.05)
    assert first["accuracy_change"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0}
    assert second["accuracy"]["mean"] == pytest.approx(0.5) and second["problems"] == 20 and second["replies"] == 40
    change = second["accuracy_change"]
    assert change["mean"] == pytest.approx(0.45) and 0 < change["lo"] < 0.45 < change["hi"] < 1
    assert second["kl"] == 2.0
    with pytest.raises(UsageError, match="do not pair with the start model's"):
        summarize_task(start + trained[:-1])


def test_a_run_and_its_checkpoints_on_heldout_problems(tiny_model_dirs, tmp_path):
    config = PPOConfig(policy_model=str(tiny_model_dirs["policy"]), out=str(tmp_path / "run"), iterations=2,
                       batch_size=4, minibatch_size=2, epochs=1, max_new_tokens=6, reward_norm_samples=4,
                       lora_rank=4, checkpoint_every=1, report_to=[], quiet=True, dtype="float32", device="cpu",
                       policy_lr=1e-2)
    PPOTrainer(config, reward_funcs=exact_match, train_dataset=problems("add-tiny", "train", 8)).train()
    result = evaluate_task_runs([tmp_path / "run"], "add-tiny", n_heldout=4, replies_per_prompt=2, batch_size=8,
                                device="cpu")
    assert [s["model"] for s in result["summary"]] == [START, "run step 1", "run step 2"]
    assert all(s["replies"] == 8 and s["problems"] == 4 for s in result["summary"])
    assert result["summary"][0]["kl"] == 0 and result["summary"][2]["kl"] != 0  # the adapter moved the policy
    heldout = {row["prompt"] for row in problems("add-tiny", "heldout", 4)}
    assert {r["prompt"] for r in result["records"]} == heldout
    assert result["settings"]["max_new_tokens"] == 6 and result["settings"]["n_heldout"] == 4
    # the same seed: the start model's replies do not depend on which checkpoints are evaluated
    again = evaluate_task_runs([tmp_path / "run"], "add-tiny", n_heldout=4, replies_per_prompt=2, batch_size=8,
                               checkpoints="2", device="cpu")
    start = [r["reply"] for r in result["records"] if r["model"] == START]
    assert [r["reply"] for r in again["records"] if r["model"] == START] == start
    with pytest.raises(UsageError, match="unknown task level"):
        evaluate_task_runs([tmp_path / "run"], "add-huge")
    # runs from one start (here RLOO next to PPO) share the start model's replies; other sampling settings are refused
    rloo = dataclasses.replace(config, out=str(tmp_path / "rloo"), advantage_estimator="rloo", group_size=2)
    PPOTrainer(rloo, reward_funcs=exact_match, train_dataset=problems("add-tiny", "train", 8)).train()
    both = evaluate_task_runs([tmp_path / "run", tmp_path / "rloo"], "add-tiny", n_heldout=4, replies_per_prompt=2,
                              batch_size=8, checkpoints="latest", device="cpu")
    assert [s["model"] for s in both["summary"]] == [START, "run step 2", "rloo step 2"]
    assert [r["reply"] for r in both["records"] if r["model"] == START] == start
    longer = dataclasses.replace(config, out=str(tmp_path / "longer"), max_new_tokens=7, iterations=1)
    PPOTrainer(longer, reward_funcs=exact_match, train_dataset=problems("add-tiny", "train", 8)).train()
    with pytest.raises(UsageError, match="the runs differ in max_new_tokens"):
        evaluate_task_runs([tmp_path / "run", tmp_path / "longer"], "add-tiny")


def test_the_shipped_task_config_trains_through_the_cli(tiny_model_dirs, tmp_path):
    from ppo_rlhf.cli import main

    config = Path(__file__).resolve().parents[2] / "configs" / "smollm2_add_tiny.yaml"
    assert main(["task", "write", "add-tiny", "--out", str(tmp_path / "data"), "--train", "8"]) == 0
    tiny = ["--policy-model", str(tiny_model_dirs["policy"]), "--prompts", str(tmp_path / "data" / "train.jsonl"),
            "--out", str(tmp_path / "run"), "--iterations", "2", "--batch-size", "4", "--minibatch-size", "2",
            "--max-new-tokens", "6", "--reward-norm-samples", "4", "--lora-rank", "4", "--critic-warmup-iterations",
            "1", "--dtype", "float32", "--device", "cpu", "--quiet", "--report-to", "none"]
    assert main(["train", "--config", str(config), *tiny]) == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all({"reward/exact_match", "reward/answer_format"} <= set(row) for row in rows)
    # ... and `ppo-rlhf task evaluate` measures its start policy and its checkpoint on held-out problems
    evaluate = ["task", "evaluate", str(tmp_path / "run"), "--out", str(tmp_path / "eval"), "--heldout", "4",
                "--batch-size", "4", "--device", "cpu", "--level", "add-tiny"]
    assert main(evaluate) == 0
    result = json.loads((tmp_path / "eval" / "task_eval.json").read_text())
    assert [s["model"] for s in result["summary"]] == [START, "run step 2"] and len(result["records"]) == 8
    assert main([*evaluate[:-1], "add-huge"]) == 2  # checked before any model loads
    # --split train: the first training problems instead (a validation split; bench/peer_grpo_screen.py's)
    assert main([*evaluate[:4], str(tmp_path / "validation"), *evaluate[5:], "--split", "train"]) == 0
    validation = json.loads((tmp_path / "validation" / "task_eval.json").read_text())
    assert validation["settings"]["split"] == "train"
    asked = {record["prompt"] for record in validation["records"]}
    assert asked == {row["prompt"] for row in problems("add-tiny", "train", 4)}
    assert not asked & {record["prompt"] for record in result["records"]}


def test_a_plain_model_folder_is_a_checkpoint_too(tiny_model_dirs, tokenizer, tmp_path):
    """Another trainer's full fine-tune (a transformers folder, as bench/peer_grpo.py saves TRL's) is evaluated beside
    our adapters: a copy of the start model answers exactly as the start model does, with KL 0; other weights do not."""
    import torch

    import tiny

    run = tmp_path / "full"
    run.mkdir()
    (run / "config.yaml").write_text(f"policy_model: {tiny_model_dirs['policy']}\ntemperature: 0.7\n"
                                     "max_new_tokens: 6\ndtype: float32\n")
    for iteration, model in ((1, tiny.tiny_causal_lm(tokenizer)), (2, tiny.tiny_causal_lm(tokenizer, seed=5))):
        folder = run / "checkpoints" / f"iter_{iteration:06d}"
        tiny.save_tiny(model, tokenizer, folder / "policy")  # iteration 1: the start model's own weights (seed 0)
        torch.save({"iteration": iteration}, folder / "state.pt")
    result = evaluate_task_runs([run], "add-tiny", n_heldout=4, replies_per_prompt=2, batch_size=8, device="cpu")
    start, same, other = result["summary"]
    assert [s["model"] for s in result["summary"]] == [START, "full step 1", "full step 2"]
    assert same["kl"] == pytest.approx(0.0, abs=1e-6) and other["kl"] > 0
    replies = {label: [r["reply"] for r in result["records"] if r["model"] == label]
               for label in (START, same["model"])}
    assert replies[START] == replies[same["model"]]


def test_calc_steps_is_evaluated_in_episodes_with_its_calculator(tiny_model_dirs, tokenizer, monkeypatch):
    """A scripted policy that calls the tool on every problem, then answers with its result (one problem wrongly):
    the checker reads the last turn, and the records count the turns, calls and the policy's tokens."""
    from ppo_rlhf.models.loading import load_causal_lm
    from ppo_rlhf.models.rollout import Replies
    from ppo_rlhf.tasks.arithmetic import task_tools
    from ppo_rlhf.tasks.evaluate import task_records

    rows = problems("calc-steps", "heldout", 3)
    questions = [row["prompt"][-1]["content"].split("What is ")[1].split("?")[0] for row in rows]
    eos = tokenizer.eos_token_id

    def sample(model, tok, trajectories, cap, *args, **kwargs):
        texts = [tok.decode(t).split("Answer: 975")[-1] for t in trajectories]  # after the demonstration
        replies = []
        for text in texts:
            row = next(i for i, q in enumerate(questions) if q in text)
            if "<|im_start|>tool" not in text:
                replies.append(f"<tool>calc({questions[row]})</tool>")
            else:
                result = text.split("<|im_start|>tool\n")[1].split("<|im_end|>")[0]
                replies.append(f"Answer: {int(result) + (row == 2)}")
        ids = [tokenizer.encode(r, add_special_tokens=False) + [eos] for r in replies]
        return Replies(ids, [True] * len(ids), [[-0.5] * len(i) for i in ids], [[1.0] * len(i) for i in ids])

    monkeypatch.setattr("ppo_rlhf.models.rollout.sample_replies", sample)
    model = load_causal_lm(str(tiny_model_dirs["policy"]), torch.float32)
    settings = {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 40, "max_turns": 3, "max_tool_calls": 2,
                "max_episode_tokens": 200, "tool_timeout": 5.0}
    records = task_records(model, tokenizer, rows, settings, 1, 0, 8, tools=task_tools("calc-steps"))
    assert [r["correct"] for r in records] == [1.0, 1.0, 0.0] and all(r["formatted"] == 1.0 for r in records)
    assert all((r["turns"], r["tool_calls"], r["tool_errors"]) == (2, 1, 0) for r in records)
    assert records[0]["reply"] == f"Answer: {rows[0]['answer']}" and f"tool\n{rows[0]['answer']}" in \
        records[0]["transcript"]
    call = f"<tool>calc({questions[0]})</tool>"
    assert records[0]["tokens"] == len(tokenizer.encode(call + f"Answer: {rows[0]['answer']}",
                                                        add_special_tokens=False)) + 1  # + the answer's EOS
    summary = summarize_task(records, n_boot=200)[0]
    assert (summary["tool_use"], summary["turns"], summary["tool_calls"]) == (1.0, 2.0, 1.0)
