"""`ppo-rlhf compare --task NAME --horizons ... --seeds N` on tiny models: every (horizon, variant, seed) trained
and evaluated, resumed where it stopped, and the JSON of docs/multi-turn.md."""

from __future__ import annotations

import json

import pytest
import yaml

from ppo_rlhf.cli import main
from ppo_rlhf.tasks import horizons

ROW_KEYS = {"horizon", "variant", "seed", "sampled_tokens", "heldout_success"}
DIFF_KEYS = {"horizon", "critic_variant", "free_variant", "diff_points", "ci95"}


def test_a_horizon_is_a_task_instance_named_with_it(monkeypatch):
    monkeypatch.setattr(horizons, "TASKS", ("add-tiny", "key-door-2", "key-door-8", "key-door-x"))
    monkeypatch.setattr("ppo_rlhf.tasks.arithmetic.TASKS", horizons.TASKS)
    assert horizons.horizon_task("key-door", 8) == "key-door-8"
    with pytest.raises(Exception, match="--horizons 4: key-door has horizons 2, 8"):
        horizons.horizon_task("key-door", 4)
    with pytest.raises(Exception, match="task add-tiny has no horizon"):
        horizons.horizon_task("add-tiny", 2)
    assert horizons.parse_horizons("8, 2,4,2") == [2, 4, 8]


@pytest.mark.parametrize("flags, message", [
    (["--task", "add-tiny", "--horizons", "2,4"], "--horizons: task add-tiny has no horizon"),
    (["--task", "add-tiny", "--horizons", "two"], "--horizons must be positive integers"),
    (["--task", "add-tiny", "--seeds", "3"], "--seeds: only with --horizons"),
    (["--seeds", "3", "--eval-prompts", "x.jsonl"], "--seeds: only with --task"),
    (["--task", "add-tiny", "--turn-level-gae"], "--turn-level-gae: no meaning with --task"),
])
def test_horizon_flags_are_refused_in_one_line(tmp_path, monkeypatch, capsys, flags, message):
    def refused(*args, **kwargs):
        raise AssertionError("refused before any stage")

    monkeypatch.setattr("ppo_rlhf.tasks.compare.Stages", refused)
    monkeypatch.setattr(horizons, "Stages", refused)
    assert main(["compare", "--out", str(tmp_path / "cmp"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "cmp").exists()


def test_compare_horizons_runs_every_seed_resumes_and_writes_the_json(tmp_path, tiny_model_dirs, monkeypatch,
                                                                      capsys):
    # a stub horizon: add-tiny at every horizon (the machinery, not a task, is under test)
    monkeypatch.setattr(horizons, "horizon_task", lambda task, horizon: "add-tiny")
    out = tmp_path / "cmp"
    args = ["compare", "--task", "add-tiny", "--horizons", "2,4", "--seeds", "2", "--variants", "ppo-turn,rloo",
            "--out", str(out), "--policy-model", str(tiny_model_dirs["policy"]), "--iterations", "2",
            "--batch-size", "4", "--minibatch-size", "2", "--max-new-tokens", "4", "--reward-norm-samples", "4",
            "--lora-rank", "2", "--dtype", "float32", "--device", "cpu", "--quiet", "--report-to", "none",
            "--heldout", "4", "--checkpoint-every", "1", "--checkpoints", "1,2", "--seed", "5"]
    trained = []
    real_train = horizons.train_in_process

    def killed_at_the_third(cfg, config_file, continuing):
        if len(trained) == 2:
            raise KeyboardInterrupt  # the comparison is stopped while its third run starts
        trained.append(cfg.out)
        return real_train(cfg, config_file, continuing)

    monkeypatch.setattr(horizons, "train_in_process", killed_at_the_third)
    assert main(args) != 0
    assert len(trained) == 2 and not (out / "critic_horizon.json").exists()
    monkeypatch.setattr(horizons, "train_in_process", real_train)
    capsys.readouterr()
    assert main(args) == 0  # the same command continues
    printed = capsys.readouterr().out
    assert printed.count("done already, skipping") == 2 + 2  # the two finished runs and both horizons' data
    # seed 0 of every variant first: a comparison stopped part-way has the same seeds of each variant
    assert "[run h2 ppo-turn_s0] done already" in printed and "[run h2 rloo_s0] done already" in printed
    assert "[run h2 ppo-turn_s1] ..." in printed

    result = json.loads((out / "critic_horizon.json").read_text())
    assert set(result) == {"task", "horizons", "seeds", "rows", "best_critic_minus_best_free", "crossover_horizon"}
    assert (result["task"], result["horizons"], result["seeds"]) == ("add-tiny", [2, 4], 2)
    assert len(result["rows"]) == 2 * 2 * 2 and all(set(row) == ROW_KEYS for row in result["rows"])
    assert {(r["horizon"], r["variant"], r["seed"]) for r in result["rows"]} == {
        (h, v, s) for h in (2, 4) for v in ("ppo-turn", "rloo") for s in (5, 6)}
    for row in result["rows"]:
        run_dir = out / f"h{row['horizon']}" / "runs" / f"{row['variant']}_s{row['seed'] - 5}"
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["seed"] == row["seed"] and config["turn_level_gae"] == (row["variant"] == "ppo-turn")
        history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
        assert row["sampled_tokens"] == pytest.approx(sum(r["len"] for r in history) * 4, abs=0.05)
        assert 0 <= row["heldout_success"] <= 1
    assert [d["horizon"] for d in result["best_critic_minus_best_free"]] == [2, 4]
    for difference in result["best_critic_minus_best_free"]:
        assert set(difference) == DIFF_KEYS
        assert (difference["critic_variant"], difference["free_variant"]) == ("ppo-turn", "rloo")
        lo, hi = difference["ci95"]
        assert lo <= difference["diff_points"] <= hi
    ahead = [d["horizon"] for d in result["best_critic_minus_best_free"] if d["ci95"][0] > 0]
    assert result["crossover_horizon"] == (min(ahead) if ahead else None)
    for name in ("critic_horizon.html", "critic_horizon.png", "critic_horizon.txt"):
        assert (out / name).is_file(), name
    page = (out / "critic_horizon.html").read_text()
    assert "critic_horizon.png" in page and "turn_level_gae" in page
    assert "success at equal tokens" in (out / "critic_horizon.txt").read_text()

    assert main([*args, "--json-out", str(tmp_path / "elsewhere.json")]) == 0  # nothing trained again
    printed = capsys.readouterr().out
    assert "[run h4 rloo_s1] done already" in printed and "[evaluate h4 start] done already" in printed
    assert json.loads((tmp_path / "elsewhere.json").read_text()) == result


def test_an_archived_comparison_continues_on_a_fresh_machine_without_training_again(tmp_path, tiny_model_dirs,
                                                                                    monkeypatch, capsys):
    # two comparisons side by side (one variant each, their own folders) keep their runs in one archive; a third
    # folder with both variants (a fresh machine: no checkpoints) trains nothing and reports from the archive
    monkeypatch.setattr(horizons, "horizon_task", lambda task, horizon: "add-tiny")
    archive = tmp_path / "archive"
    common = ["compare", "--task", "add-tiny", "--horizons", "2", "--seeds", "1", "--archive", str(archive),
              "--policy-model", str(tiny_model_dirs["policy"]), "--iterations", "2", "--batch-size", "4",
              "--minibatch-size", "2", "--max-new-tokens", "4", "--reward-norm-samples", "4", "--lora-rank", "2",
              "--dtype", "float32", "--device", "cpu", "--quiet", "--report-to", "none", "--heldout", "4",
              "--checkpoint-every", "1", "--checkpoints", "1,2", "--seed", "5"]
    for variant in ("ppo-turn", "rloo"):
        assert main([*common, "--variants", variant, "--out", str(tmp_path / variant)]) == 0
    assert sorted(path.name for path in (archive / "stages").iterdir()) == [
        "evaluate_h2_start.json", "run_h2_ppo-turn_s0.json", "run_h2_rloo_s0.json"]
    assert not list(archive.rglob("checkpoints"))
    capsys.readouterr()

    def no_training(*args, **kwargs):
        raise AssertionError("an archived run is not trained again")

    monkeypatch.setattr(horizons, "train_in_process", no_training)
    monkeypatch.setattr("ppo_rlhf.tasks.evaluate.evaluate_task_runs", no_training)
    both = tmp_path / "both"
    assert main([*common, "--variants", "ppo-turn,rloo", "--out", str(both)]) == 0
    printed = capsys.readouterr().out
    # the data are written again (seeded, a second); the runs and the start model's evaluation are the archive's
    assert "taken from the archive" in printed and printed.count("done already, skipping") == 3
    assert "[data h2] ..." in printed
    result = json.loads((both / "critic_horizon.json").read_text())
    alone = {variant: json.loads((tmp_path / variant / "critic_horizon.json").read_text())["rows"][0]
             for variant in ("ppo-turn", "rloo")}
    assert {row["variant"]: row for row in result["rows"]} == alone
    assert result["best_critic_minus_best_free"][0]["critic_variant"] == "ppo-turn"


def test_a_comparisons_evaluation_in_parts_is_one_evaluation_of_every_model(tmp_path, tiny_model_dirs, monkeypatch):
    # each run is evaluated when it finishes and the start model on its own: put together, the records and summaries
    # are those of one evaluation of the start model and every checkpoint (each model samples from the same seed)
    from ppo_rlhf.tasks.evaluate import evaluate_task_runs

    monkeypatch.setattr(horizons, "horizon_task", lambda task, horizon: "add-tiny")
    out = tmp_path / "cmp"
    assert main(["compare", "--task", "add-tiny", "--horizons", "2", "--seeds", "1", "--variants", "ppo,grpo",
                 "--out", str(out), "--policy-model", str(tiny_model_dirs["policy"]), "--iterations", "2",
                 "--batch-size", "4", "--minibatch-size", "2", "--max-new-tokens", "4", "--reward-norm-samples", "4",
                 "--lora-rank", "2", "--dtype", "float32", "--device", "cpu", "--quiet", "--report-to", "none",
                 "--heldout", "4", "--checkpoint-every", "1", "--checkpoints", "1,2", "--seed", "5"]) == 0
    joined = json.loads((out / "h2" / "evaluation" / "task_eval.json").read_text())
    runs = [out / "h2" / "runs" / name for name in ("ppo_s0", "grpo_s0")]
    whole = json.loads(json.dumps(evaluate_task_runs(runs, "add-tiny", 4, 1, "1,2", 1234, horizons.EVAL_BATCH,
                                                     "cpu")))
    assert [r["model"] for r in joined["records"]] == [r["model"] for r in whole["records"]]
    assert joined["records"] == whole["records"] and joined["summary"] == whole["summary"]
    assert joined["settings"] == whole["settings"]
