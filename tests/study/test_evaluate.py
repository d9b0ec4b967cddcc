import json
import math

import numpy as np
import pytest
import torch
import yaml

from ppo_rlhf.cli import main
from ppo_rlhf.study.evaluate import (
    START,
    before_after,
    evaluate_runs,
    format_evaluation,
    model_label,
    standardize_records,
    summarize,
)
from ppo_rlhf.study.stats import paired_bootstrap


def record(run, iteration, prompt_index, reply_index, proxy_raw, gold_raw, finished=True, tokens=5, kl=0.0,
           reply="a b"):
    return {
        "model": model_label(run, iteration),
        "run": run,
        "iteration": iteration,
        "prompt_index": prompt_index,
        "reply_index": reply_index,
        "prompt": f"prompt {prompt_index}",
        "reply": reply,
        "tokens": tokens,
        "finished": finished,
        "kl": kl,
        "entropy_sum": 0.5 * tokens,
        "proxy_raw": proxy_raw,
        "gold_raw": gold_raw,
    }


def synthetic_records():
    # start: proxy raw 1, 3 (mean 2, std 1); gold raw 0, 10 (mean 5, std 5)
    start = [record(None, None, 0, 0, 1.0, 0.0), record(None, None, 1, 0, 3.0, 10.0, finished=False, tokens=9)]
    # the checkpoint is 1 start-std better on proxy for every pair, and 0.4 worse on gold
    ckpt = [
        record("beta005", 10, 0, 0, 2.0, -2.0, kl=1.5, tokens=3),
        record("beta005", 10, 1, 0, 4.0, 8.0, kl=2.5, tokens=7),
    ]
    return start + ckpt


def test_standardize_and_paired_changes():
    records = synthetic_records()
    norms = standardize_records(records)
    assert norms["proxy"] == {"mean": 2.0, "std": 1.0}
    assert [r["proxy"] for r in records] == [-1.0, 1.0, 0.0, 2.0]
    start, ckpt = summarize(records, n_boot=500)
    for judge in ("proxy", "gold"):
        assert start[f"{judge}_change"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0}
    assert ckpt["proxy_change"] == pytest.approx({"mean": 1.0, "lo": 1.0, "hi": 1.0})  # constant paired diffs
    assert ckpt["gold_change"] == pytest.approx({"mean": -0.4, "lo": -0.4, "hi": -0.4})
    assert ckpt["kl"] == pytest.approx(2.0) and start["kl"] == 0.0
    assert ckpt["tokens"] == 5.0 and start["finished"] == 0.5
    assert ckpt["entropy"] == pytest.approx(0.5)


def test_change_intervals_resample_prompts():
    # 6 prompts x 2 replies; the checkpoint's change is mostly its prompt's (shared by both replies)
    rng = np.random.default_rng(0)
    effect = rng.normal(size=6)
    records = []
    for j in range(6):
        for i in range(2):
            start_proxy, start_gold = rng.normal(size=2)
            change = effect[j] + 0.1 * rng.normal()
            records += [record(None, None, j, i, start_proxy, start_gold),
                        record("beta005", 10, j, i, start_proxy + change, start_gold - change)]
    standardize_records(records)
    start, ckpt = summarize(records, n_boot=2000, seed=3)
    diffs = np.array([c["proxy"] - s["proxy"] for s, c in zip(records[::2], records[1::2])])
    prompts = [r["prompt_index"] for r in records[::2]]
    by_prompt = paired_bootstrap(diffs, prompts, n_boot=2000, seed=3)
    by_reply = paired_bootstrap(diffs, None, n_boot=2000, seed=3)
    assert (ckpt["proxy_change"]["lo"], ckpt["proxy_change"]["hi"]) == pytest.approx(by_prompt[1:])
    assert by_prompt[2] - by_prompt[1] > by_reply[2] - by_reply[1]  # the shared effect widens the interval


def test_eos_rule_only_hits_unfinished_replies():
    records = synthetic_records()
    standardize_records(records, unfinished_score=-1.0)
    assert [r["proxy_eos"] for r in records] == [-1.0, -1.0, 0.0, 2.0]  # the 2nd start reply never ended
    start, ckpt = summarize(records, n_boot=100)
    assert start["proxy_eos"] == -1.0 and ckpt["proxy_eos"] == 1.0
    assert start["proxy"] == 0.0  # without the rule the start model averages 0 by construction
    # its change is paired like the judges': (0 - (-1) + 2 - (-1)) / 2 replies
    assert ckpt["proxy_eos_change"]["mean"] == pytest.approx(2.0)


def test_pairing_mismatch_is_rejected():
    records = synthetic_records()[:3]
    standardize_records(records)
    with pytest.raises(Exception, match="pair"):
        summarize(records)


def test_before_after_uses_last_checkpoint_and_formats():
    records = synthetic_records() + [
        record("beta005", 20, 0, 0, 3.0, 5.0, reply="Okay."),
        record("beta005", 20, 1, 0, 3.0, 5.0),
    ]
    standardize_records(records)
    examples = before_after(records, n_prompts=1)
    assert len(examples) == 1
    assert [r["model"] for r in examples[0]["replies"]] == [START, "beta005 step 20"]
    text = format_evaluation(summarize(records, n_boot=100), examples, 2)
    assert "beta005  step 10: proxy change +1.000 [+1.000, +1.000]  gold change -0.400" in text
    assert "proxy with EOS rule" in text and "(start -1.000)" in text
    assert "PROMPT: 'prompt 0'" in text and "'Okay.'" in text


# ---------------------------------------------------------------- end to end on tiny models


PROMPTS = ["Hello!", "Tell me a story.", "What is energy?"]


def save_adapter(policy_dir, folder, scale, seed):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(policy_dir), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:  # B = 0 would make the adapter a no-op
                parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(folder)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_dirs):
    run = tmp_path_factory.mktemp("runs") / "beta005"
    config = {
        "policy_model": str(tiny_model_dirs["policy"]),
        "reward_model": str(tiny_model_dirs["reward"]),
        "temperature": 0.1,  # the tiny random models are near uniform; a low temperature lets the adapter matter
        "max_new_tokens": 6,
        "seed": 1,
    }
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    for iteration, scale in ((1, 0.3), (2, 1.0)):
        folder = run / "checkpoints" / f"iter_{iteration:06d}"
        save_adapter(tiny_model_dirs["policy"], folder / "policy", scale, seed=iteration)
        torch.save({"iteration": iteration}, folder / "state.pt")
    (run / "checkpoints" / "latest").write_text("iter_000002\n")
    return run


@pytest.fixture(scope="module")
def evaluation(run_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    prompts = root / "heldout.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    out = root / "eval"
    code = main(["evaluate", str(run_dir), "--prompts", str(prompts), "--gold", "vader", "--out", str(out),
                 "--batch-size", "4"])
    assert code == 0
    return out


def test_evaluate_end_to_end(evaluation):
    assert (evaluation / "evaluation.txt").is_file()
    result = json.loads((evaluation / "evaluation.json").read_text())
    start, step1, step2 = result["summary"]
    assert [s["model"] for s in result["summary"]] == [START, "beta005 step 1", "beta005 step 2"]
    assert start["proxy_change"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0}
    assert start["gold_change"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0}
    assert start["kl"] == 0.0 and abs(start["proxy"]) < 1e-9
    assert step2["kl"] > 0.0  # a far-moved policy scores its own samples higher than the start model does
    for s in result["summary"]:
        assert 0.0 <= s["finished"] <= 1.0 and s["replies"] == 6 and s["entropy"] > 0
        assert all(math.isfinite(s[k]) for k in ("proxy", "gold", "proxy_eos", "tokens", "kl"))
    assert len(result["records"]) == 18
    replies = {s: [r["reply"] for r in result["records"] if r["model"] == s] for s in (START, "beta005 step 2")}
    assert replies[START] != replies["beta005 step 2"]
    assert [e["prompt"] for e in result["examples"]] == PROMPTS
    text = (evaluation / "evaluation.txt").read_text()
    assert "beta005  step 1: proxy change" in text and "PROMPT: 'Hello!'" in text


def test_same_seed_same_start_replies(run_dir, evaluation, tmp_path):
    again = tmp_path / "again"
    prompts = evaluation.parent / "heldout.jsonl"
    code = main(["evaluate", str(run_dir), "--prompts", str(prompts), "--gold", "vader", "--out", str(again),
                 "--checkpoints", "latest", "--batch-size", "4"])
    assert code == 0
    first = json.loads((evaluation / "evaluation.json").read_text())["records"]
    second = json.loads((again / "evaluation.json").read_text())["records"]
    assert [r["reply"] for r in first if r["model"] != "beta005 step 1"] == [r["reply"] for r in second]


def test_missing_run_dir_is_a_usage_error(tmp_path, capsys):
    code = main(["evaluate", str(tmp_path / "nope"), "--prompts", "x.jsonl", "--out", str(tmp_path / "e")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "not found" in err and len(err.splitlines()) == 1


def test_unknown_checkpoint_is_a_usage_error(run_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')  # (a missing prompts file is reported first, before torch loads)
    code = main(["evaluate", str(run_dir), "--prompts", str(prompts), "--out", str(tmp_path), "--checkpoints", "7"])
    assert code == 2
    assert "no checkpoint for iteration 7" in capsys.readouterr().err


def test_report_on_the_evaluation(run_dir, evaluation, tmp_path):
    from ppo_rlhf.study.report import write_report

    rows = [{"iteration": i, "score": 0.1 * i, "kl": 0.5 * i, "fin": 0.8, "ev": -0.5 + 0.2 * i} for i in range(3)]
    (run_dir / "history.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    page = write_report([run_dir], evaluation, tmp_path / "report")
    assert (tmp_path / "report" / "dashboard.png").is_file()
    assert (tmp_path / "report" / "overoptimisation.png").is_file()
    assert page.read_text().count("data:image/png;base64,") == 2


def test_a_file_given_as_a_run_directory_says_so(tmp_path, capsys):
    from ppo_rlhf.cli import main

    path = tmp_path / "config.yaml"
    path.write_text("policy_model: x\n")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    assert main(["evaluate", str(path), "--prompts", str(prompts), "--out", str(tmp_path / "e")]) == 2
    assert "is a file, not a run directory" in capsys.readouterr().err


def test_the_kl_to_the_start_model_is_k3_and_never_negative(evaluation):
    """Issue 29 item 14: k1 sums per reply can be negative (a mean printed "KL -0.0"); k3 per token cannot."""
    result = json.loads((evaluation / "evaluation.json").read_text())
    assert result["settings"]["kl"].startswith("k3 estimate of KL(model || start model)")
    kls = [r["kl"] for r in result["records"]]
    assert min(kls) >= 0.0 and max(kls) > 0.0
    assert all(s["kl"] >= 0.0 for s in result["summary"])
    text = (evaluation / "evaluation.txt").read_text()
    assert "KL: the k3 estimate" in text and "KL -" not in text


def evaluate_counting_loads(monkeypatch, run_dir, prompts, out, **options):
    """evaluate_runs on the module's run, and the labels of the models it sampled."""
    import ppo_rlhf.study.evaluate as evaluate

    sampled, real = [], evaluate.sample_records
    monkeypatch.setattr(evaluate, "sample_records", lambda *a, **k: sampled.append(model_label(k["run"],
                                                                                                k["iteration"]))
                        or real(*a, **k))
    result = evaluate_runs([run_dir], prompts, out, gold="vader", batch_size=4, **options)
    return result, sampled


def test_a_rerun_evaluates_only_models_whose_key_changed(run_dir, evaluation, tmp_path, monkeypatch):
    """Issue 29 item 18: stored records are reused for unchanged keys, and the result equals a full evaluation's
    (sampling is seeded per model, so no model's replies depend on which models are evaluated with it)."""
    prompts, out = evaluation.parent / "heldout.jsonl", tmp_path / "eval"
    keys = {None: "start key", "beta005": "run key"}  # a run's key covers its checkpoints
    _, sampled = evaluate_counting_loads(monkeypatch, run_dir, prompts, out, checkpoints="1", model_keys=keys)
    assert sampled == [START, "beta005 step 1"]
    result, sampled = evaluate_counting_loads(monkeypatch, run_dir, prompts, out, model_keys=keys)
    assert sampled == ["beta005 step 2"]  # only the checkpoint without stored records
    full = json.loads((evaluation / "evaluation.json").read_text())
    same = lambda a, b: json.dumps(a) == json.dumps(b)  # noqa: E731  (NaN == NaN, unlike in Python)
    assert same(result["summary"], full["summary"]) and same(result["norms"], full["norms"])
    keyless = lambda records: [{k: v for k, v in r.items() if k != "key"} for r in records]  # noqa: E731
    assert same(keyless(result["records"]), keyless(full["records"]))
    assert [r["key"] for r in result["records"]] == [keys[r["run"]] for r in result["records"]]
    keys["beta005"] = "run key 2"  # the run trained again: its checkpoints changed
    _, sampled = evaluate_counting_loads(monkeypatch, run_dir, prompts, out, model_keys=keys)
    assert sampled == ["beta005 step 1", "beta005 step 2"]
    _, sampled = evaluate_counting_loads(monkeypatch, run_dir, prompts, out, model_keys=keys, seed=7)  # other settings
    assert sampled == [START, "beta005 step 1", "beta005 step 2"]
    _, sampled = evaluate_counting_loads(monkeypatch, run_dir, prompts, out, model_keys=keys, seed=7)
    assert sampled == []


def test_prompts_beyond_the_models_context_are_refused_naming_the_line(run_dir, tmp_path, capsys):
    """Issue 29 item 18: as train does (trainer.check_prompt_lengths), not exit 0 with cut prompts."""
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "Hello!"}) + "\n" + json.dumps({"prompt": "word " * 600}) + "\n")
    code = main(["evaluate", str(run_dir), "--prompts", str(prompts), "--gold", "vader", "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{prompts}:2: the prompt (" in err and "exceed the models' context of 512 tokens" in err
    assert not (tmp_path / "e").exists()


# ---------------------------------------------------------------- a run trained with reward functions

# a reward reading the dataset column "answer", whose value the tests recompute from an evaluation's records
OWN_REWARDS = '''
def correct(prompts, completions, completion_ids, answer, **kwargs):
    return [10.0 * len(a) + len(c) + 0.5 * len(ids) for c, a, ids in zip(completions, answer, completion_ids)]


def brief(completions, **kwargs):
    return [-float(len(c)) for c in completions]
'''
ANSWERS = {"Hello!": "hi", "Tell me a story.": "once upon a time", "What is energy?": "work"}


def own_reward(reply: str, answer: str, tokens: int) -> float:
    return 10.0 * len(answer) + len(reply) + 0.5 * tokens


@pytest.fixture(scope="module")
def own_reward_run(tmp_path_factory, tiny_model_dirs):
    """A run trained by `ppo-rlhf train --reward-funcs my_rewards.py:correct --reward-weights 2` (no reward model) on
    prompts with an "answer" column, and held-out prompts with theirs."""
    root = tmp_path_factory.mktemp("own_reward")
    (root / "my_rewards.py").write_text(OWN_REWARDS)
    for name in ("train.jsonl", "heldout.jsonl"):
        (root / name).write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n" for p, a in ANSWERS.items()))
    run = root / "own_reward"
    code = main(["train", "--policy-model", str(tiny_model_dirs["policy"]), "--prompts", str(root / "train.jsonl"),
                 "--reward-funcs", f"{root / 'my_rewards.py'}:correct", "--reward-weights", "2.0", "--out", str(run),
                 "--iterations", "1", "--batch-size", "4", "--minibatch-size", "2", "--epochs", "1",
                 "--max-new-tokens", "6", "--reward-norm-samples", "4", "--lora-rank", "4", "--checkpoint-every", "1",
                 "--temperature", "0.7", "--no-tensorboard", "--quiet", "--dtype", "float32"])
    assert code == 0
    return root, run


def test_a_run_trained_with_a_reward_function_is_evaluated_with_its_own_rewards(own_reward_run):
    """Issue 58 item 6: by default the proxy is the run's rewards as config.yaml records them (weights included),
    each function given the held-out prompts' other columns and the replies' token ids, as in training."""
    root, run = own_reward_run
    out = root / "eval_own"
    code = main(["evaluate", str(run), "--eval-prompts", str(root / "heldout.jsonl"), "--gold", "vader", "--out",
                 str(out), "--batch-size", "4"])
    assert code == 0
    result = json.loads((out / "evaluation.json").read_text())
    assert result["settings"]["proxy"] == {"reward_funcs": [f"{(root / 'my_rewards.py').resolve()}:correct"],
                                           "reward_weights": [2.0]}
    records = result["records"]
    assert [r["model"] for r in records[::6]] == [START, "own_reward step 1"]
    assert [r["proxy_raw"] for r in records] == [2.0 * own_reward(r["reply"], ANSWERS[r["prompt"]], r["tokens"])
                                                 for r in records]
    assert len({r["proxy_raw"] for r in records}) > 1


def test_reward_functions_as_proxy_and_gold(own_reward_run):
    """`--proxy` and `--gold` take the specs `train --reward-funcs` takes (here file.py:function), weight 1."""
    root, run = own_reward_run
    out = root / "eval_given"
    code = main(["evaluate", str(run), "--prompts", str(root / "heldout.jsonl"), "--proxy",
                 f"{root / 'my_rewards.py'}:brief", "--gold", f"{root / 'my_rewards.py'}:correct", "--out", str(out),
                 "--batch-size", "4", "--checkpoints", "latest"])
    assert code == 0
    records = json.loads((out / "evaluation.json").read_text())["records"]
    assert [r["proxy_raw"] for r in records] == [-float(len(r["reply"])) for r in records]
    assert [r["gold_raw"] for r in records] == [own_reward(r["reply"], ANSWERS[r["prompt"]], r["tokens"])
                                                for r in records]
