"""`ppo-rlhf demo --task` (ppo_rlhf/tasks/demo.py, task_report.py): the preset it runs, the sentences its report opens
with (from made-up numbers), its stages on a tiny model (run, skipped when done, the report's numbers those of
task_eval.json), and the flags it refuses."""

from __future__ import annotations

import dataclasses
import html
import json
from pathlib import Path

import pytest

from ppo_rlhf.cli import main
from ppo_rlhf.config import build_config, read_yaml
from ppo_rlhf.ppo.train_config import TrainConfig
from ppo_rlhf.study.evaluate import START
from ppo_rlhf.tasks.demo import PRESET, train_config
from ppo_rlhf.tasks.report import opening_sentence, time_sentence, tool_sentence

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_trains_exactly_the_shipped_preset(tmp_path):
    assert PRESET == REPO / "configs" / "smollm2_add_tiny.yaml"
    cfg = train_config(tmp_path, quick=False, overrides={})
    shipped = build_config(TrainConfig, read_yaml(PRESET))
    assert dataclasses.replace(cfg, prompts=shipped.prompts, out=shipped.out) == shipped
    assert cfg.prompts == str(tmp_path / "data" / "train.jsonl") and cfg.out == str(tmp_path / "ppo")
    assert cfg.iterations // cfg.checkpoint_every == 6  # six checkpoints to evaluate
    quick = train_config(tmp_path, quick=True, overrides={"seed": 3})
    assert quick.iterations == 2 and quick.critic_warmup_iterations == 1 and quick.seed == 3


def summary(start: float, last: float, change: tuple[float, float, float], iteration: int = 30) -> list[dict]:
    def model(run, it, accuracy, c):
        return {"model": START if run is None else f"ppo step {it}", "run": run, "iteration": it, "problems": 200,
                "accuracy": {"mean": accuracy, "lo": accuracy - 0.05, "hi": accuracy + 0.05},
                "accuracy_change": dict(zip(("mean", "lo", "hi"), c))}
    return [model(None, None, start, (0.0, 0.0, 0.0)), model("ppo", iteration // 2, 0.2, (0.02, -0.01, 0.05)),
            model("ppo", iteration, last, change)]


def test_opening_sentence_says_whether_the_interval_excludes_zero():
    gained = opening_sentence(summary(0.175, 0.705, (0.53, 0.46, 0.605)), "add-tiny")
    assert gained == ("On 200 held-out add-tiny problems, exact match went from 17.5% [12.5, 22.5] (start model) to "
                      "70.5% [65.5, 75.5] after 30 iterations: a change of +53.0 [+46.0, +60.5] points (95% paired "
                      "bootstrap over problems), an interval that excludes zero: PPO raised held-out accuracy.")
    unclear = opening_sentence(summary(0.175, 0.2, (0.025, -0.03, 0.08)), "add-tiny")
    assert "+2.5 [-3.0, +8.0] points" in unclear
    assert "an interval that includes zero, so this run does not show a change" in unclear
    assert "about ±5.5 points wide" in unclear and "excludes" not in unclear
    same = opening_sentence(summary(0.0, 0.0, (0.0, 0.0, 0.0)), "add-tiny")
    assert same.endswith("an interval that includes zero: the last checkpoint was right on exactly the problems the "
                         "start model was right on, so there is no change to measure.")
    fell = opening_sentence(summary(0.3, 0.1, (-0.2, -0.27, -0.13)), "add-small")
    assert fell.endswith("an interval that excludes zero: held-out accuracy fell.") and "add-small" in fell
    smoke = opening_sentence(summary(0.175, 0.705, (0.53, 0.46, 0.605), iteration=2), "add-tiny", quick=True)
    assert smoke.startswith("A smoke run (--quick: 200 held-out problems, 2 iterations") and "not a result" in smoke


def test_time_sentence_adds_the_stages_and_compares_with_30_minutes():
    under = time_sentence({"data": 0.2, "ppo": 488.0, "evaluation": 231.0})
    assert "data 0 s, ppo 488 s, evaluation 231 s; total 719 s (12.0 minutes), under the 30 minutes" in under
    assert "1900 s (31.7 minutes), over the 30 minutes" in time_sentence({"ppo": 1500.0, "evaluation": 400.0})


def test_task_demo_runs_its_stages_skips_them_when_done_and_reports_the_numbers(tiny_model_dirs, tmp_path, capsys):
    out = tmp_path / "demo"
    args = ["demo", "--task", "add-tiny", "--quick", "--model", str(tiny_model_dirs["policy"]), "--out", str(out),
            "--device", "cpu", "--dtype", "float32"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    for path in ("data/train.jsonl", "data/heldout.jsonl", "ppo/checkpoints/iter_000002/state.pt",
                 "eval/task_eval.json", "report/report.html", "report/report.md", "report/summary.txt",
                 "report/accuracy.png", "report/accuracy_vs_kl.png", "report/length.png", "report/dashboard.png",
                 "timings.json", "stages.json", "demo.yaml"):
        assert (out / path).is_file(), path
    assert len((out / "data" / "train.jsonl").read_text().splitlines()) == 32
    evaluation = json.loads((out / "eval" / "task_eval.json").read_text())
    assert [s["model"] for s in evaluation["summary"]] == [START, "ppo step 1", "ppo step 2"]
    assert evaluation["settings"]["n_heldout"] == 20 and evaluation["settings"]["seed"] == 1234
    opening = opening_sentence(evaluation["summary"], "add-tiny", quick=True)
    page = (out / "report" / "report.html").read_text()
    assert html.escape(opening) in page and opening in printed
    assert "(smoke run)" in page and "start model" in page and ("✓ correct" in page or "✗ wrong" in page)
    timings = json.loads((out / "timings.json").read_text())
    assert list(timings) == ["data", "ppo", "evaluation", "report"]
    shown = {name: seconds for name, seconds in timings.items() if name != "report"}
    assert html.escape(time_sentence(shown)) in page

    assert main(args) == 0  # everything done: every stage skipped, nothing rewritten
    printed = capsys.readouterr().out
    for name in ("data", "ppo", "evaluation", "report"):
        assert f"[{name}] done already, skipping" in printed
    assert (out / "report" / "report.html").read_text() == page


@pytest.mark.parametrize("flags, named", [
    (["--betas", "0.1"], "--betas has no meaning with --task"),
    (["--candidates", "5", "--reply-cap", "8"], "--candidates, --reply-cap have no meaning with --task"),
])
def test_task_demo_refuses_the_offline_study_flags(tmp_path, monkeypatch, capsys, flags, named):
    def refused(*args, **kwargs):
        raise AssertionError("refused before any stage (else this test would train SmolLM2)")

    monkeypatch.setattr("ppo_rlhf.tasks.demo.Stages", refused)
    assert main(["demo", "--task", "add-tiny", "--out", str(tmp_path / "demo"), *flags]) == 2
    err = capsys.readouterr().err
    assert named in err and "--out, --quick, --model" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "demo").exists()


def test_task_demo_refuses_an_unknown_level_and_too_few_iterations(tmp_path, monkeypatch, capsys):
    def refused(*args, **kwargs):
        raise AssertionError("refused before any stage (else this test would train SmolLM2)")

    monkeypatch.setattr("ppo_rlhf.tasks.demo.Stages", refused)
    assert main(["demo", "--task", "add-huge", "--out", str(tmp_path / "demo")]) == 2
    assert "unknown task level 'add-huge'" in capsys.readouterr().err
    assert main(["demo", "--task", "add-tiny", "--iterations", "3", "--out", str(tmp_path / "demo")]) == 2
    assert "critic_warmup_iterations (3, from the preset " in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


def test_calc_steps_demo_runs_multi_turn_episodes_and_reports_tool_use(tiny_model_dirs, tmp_path, capsys):
    assert train_config(tmp_path, quick=False, overrides={}, task="calc-steps").tools == \
        ["ppo_rlhf.tasks.calc_steps:calc"]
    out = tmp_path / "demo"
    assert main(["demo", "--task", "calc-steps", "--quick", "--model", str(tiny_model_dirs["policy"]), "--out",
                 str(out), "--device", "cpu", "--dtype", "float32"]) == 0
    capsys.readouterr()
    history = [json.loads(line) for line in (out / "ppo" / "history.jsonl").read_text().splitlines()]
    assert len(history) == 2 and all(0 < row["turns"] <= 3 and "tool_calls" in row for row in history)
    evaluation = json.loads((out / "eval" / "task_eval.json").read_text())
    assert evaluation["settings"]["max_turns"] == 3 and evaluation["settings"]["level"] == "calc-steps"
    heldout = [json.loads(line)["prompt"] for line in (out / "data" / "heldout.jsonl").read_text().splitlines()]
    records = evaluation["records"]
    assert [r["prompt"] for r in records if r["model"] == START] == heldout  # the written held-out problems
    assert all(1 <= r["turns"] <= 3 and r["tokens"] <= len(r["transcript"]) for r in records)
    start = evaluation["summary"][0]
    assert start["turns"] == sum(r["turns"] for r in records if r["model"] == START) / len(heldout)
    assert 0 <= start["tool_use"] <= 1 and start["kl"] == 0
    page = (out / "report" / "report.html").read_text()
    assert (out / "report" / "turns.png").is_file() and "Turns and tool use" in page
    assert html.escape(tool_sentence(evaluation["summary"])) in page and "tool errors" in page
